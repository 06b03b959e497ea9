"""The reconcile's wait hears of a RayCluster's changes through one watch per namespace,
in both worlds (the real kube-apiserver and KubeRay operator decide): an edit of its spec
or annotations is a change, a status write (KubeRay writes many) is none."""

from __future__ import annotations

import asyncio
import time

from kubernetes import client

from bench.clusters import small_raycluster
from raysize.activities.pod_watch import PodWatch, raycluster_mark


def test_annotations_wake_the_cluster_watch_and_status_writes_do_not(kube, ns) -> None:
    custom, core = client.CustomObjectsApi(kube), client.CoreV1Api(kube)
    rc = small_raycluster("watched", workers=0, max_workers=1)
    custom.create_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", rc)

    def mark() -> str:
        return raycluster_mark(
            custom.get_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", "watched")
        )

    watch = PodWatch(core, custom)

    async def run() -> tuple[bool, bool]:
        with watch.subscribe_cluster(ns, "watched"):
            await asyncio.sleep(1.0)  # the watch has seen the cluster as it is
            before = mark()
            custom.patch_namespaced_custom_object_status(
                "ray.io", "v1", ns, "rayclusters", "watched", {"status": {"reason": "a test"}}
            )
            await asyncio.sleep(2.0)
            after_status = watch.cluster_changed_since(ns, "watched", None, before)
            custom.patch_namespaced_custom_object(
                "ray.io", "v1", ns, "rayclusters", "watched",
                {"metadata": {"annotations": {"ray.io/ippr": '{"groups": {}}'}}},
            )  # fmt: skip
            end = time.monotonic() + 20
            while not watch.cluster_changed_since(ns, "watched", None, before):
                if time.monotonic() > end:
                    return after_status, False
                await asyncio.sleep(0.1)
            return after_status, True

    try:
        status_woke, annotation_woke = asyncio.run(run())
    finally:
        watch.close()
        custom.delete_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", "watched")
    assert status_woke is False
    assert annotation_woke is True
