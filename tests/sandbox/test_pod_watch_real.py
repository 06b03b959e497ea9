"""The pod watch against the real kube-apiserver's own 410 Gone.

The real server serves pod watches from its watch cache, which replays old
resourceVersions for a long time after etcd compacted them (more than 60 s here), so a
real 410 on a pod watch does not come within a test. With `--watch-cache=false`
(`RealControlPlane(watch_cache=False)`) every watch reads etcd, and a watch from a
version etcd has compacted (every 10 s in the real world) is answered at once with

    {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
     "status": "Failure", "message": "The resourceVersion for the provided watch is too
     old.", "reason": "Expired", "code": 410}}

as a long-lived cluster's busy watch cache would answer. The embedded server's 410 (a
window of 5 events) is tested in `test_pod_watch.py`."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from raysize.activities.pod_watch import PodWatch, pods_mark
from raysize.sandbox.realworld import RealControlPlane

from .conftest import KUBERNETES_VERSION, pod_body, wait_for
from .test_pod_watch import HeldWatches, heard

NS = "default"


@pytest.fixture(scope="module")
def uncached(tmp_path_factory: pytest.TempPathFactory) -> Iterator[client.CoreV1Api]:
    """The real etcd and kube-apiserver with the watch cache off (no KubeRay, no kubelet:
    pods stay Pending, written only by the test)."""
    with RealControlPlane(KUBERNETES_VERSION, operator=False, watch_cache=False) as cp:
        path = cp.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")
        api = config.new_client_from_config(config_file=str(path))
        try:
            yield client.CoreV1Api(api)
        finally:
            api.close()


def watch_from(core: client.CoreV1Api, version: str) -> tuple[int, list[dict[str, Any]]]:
    """The HTTP status and the events of a raw watch of the namespace's pods from
    `version`, for a second."""
    resp = core.list_namespaced_pod(
        NS, watch=True, resource_version=version, timeout_seconds=1, _preload_content=False
    )
    try:
        return resp.status, [json.loads(line) for line in resp.read().splitlines() if line]
    finally:
        resp.release_conn()


def test_a_watch_the_real_server_answers_410_lists_again_and_hears_what_changed(
    uncached: client.CoreV1Api, caplog: pytest.LogCaptureFixture
) -> None:
    """PodWatch resumes from a version etcd has compacted; the real server answers 410
    Expired; PodWatch lists again and delivers what changed meanwhile: a pod deleted ends
    its waiter, a patched pod is seen as the patches left it, and the watch goes on."""
    core = uncached
    for name in ("a", "b"):
        core.create_namespaced_pod(NS, pod_body(name, labels={"ray.io/cluster": "c"}))
    held = HeldWatches(core)
    pods = PodWatch(held, timeout_s=1)  # each watch ends after a second, and is resumed
    answer: list[dict[str, Any]] = []
    status = [0]

    def expired(version: str) -> bool:
        """Has etcd compacted `version`? (The raw watch's answer is kept.)"""
        status[0], events = watch_from(core, version)
        answer[:] = [e for e in events if e.get("type") == "ERROR"]
        return bool(answer)

    cached: list[Any] = []  # the pod cache: away, then after the 410's list

    async def run() -> tuple[bool, str, str, float]:
        with pods.subscribe(NS, "a") as a, pods.subscribe(NS, "b") as b:
            await asyncio.to_thread(wait_for, lambda: held.watches >= 1)
            held.open.clear()  # the next connection waits: the watch is away
            await asyncio.to_thread(wait_for, held.held.is_set, 10)
            cached.append(pods.cluster_pods(NS, "c"))  # away: no answer from the cache
            core.delete_namespaced_pod("a", NS, grace_period_seconds=0)
            for i in range(3):
                core.patch_namespaced_pod("b", NS, {"metadata": {"labels": {"i": str(i)}}})
            # etcd compacts to the revision it saw one interval (10 s) before: wait until
            # the version the watch will resume from is gone
            started = time.monotonic()
            await asyncio.to_thread(wait_for, lambda: expired(held.version), 45, 0.5)
            compacted_after = time.monotonic() - started
            a.event.clear()
            held.open.set()
            await a.wait(10)
            deleted = a.deleted

            seen = await heard(b, "2")  # the list's b, as the patches left it
            # and the watch goes on from the list
            core.patch_namespaced_pod("b", NS, {"metadata": {"labels": {"i": "after"}}})
            after = await heard(b, "after")
            # (each watch here lasts a second: between two, the cache does not answer)
            cached.append(await asyncio.to_thread(wait_for, lambda: pods.cluster_pods(NS, "c")))
            return deleted, seen, after, compacted_after

    with caplog.at_level(logging.INFO, logger="raysize.activities"):
        try:
            deleted, seen, after, compacted_after = asyncio.run(run())
        finally:
            pods.close()
    said = [r.getMessage() for r in caplog.records]
    # the real server's own answer to a watch from the compacted version: the watch
    # starts (HTTP 200), and its one event is the 410
    assert status[0] == 200
    assert answer == [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": "The resourceVersion for the provided watch is too old.",
                "reason": "Expired",
                "code": 410,
            },
        }
    ], answer
    # what changed while the watch was away was delivered, and the watch went on
    assert deleted is True, said
    assert (seen, after) == ("2", "after"), said
    # and the observe's cache: no answer while the watch was away (the observe lists),
    # then the list's pods as the server has them, the watch's changes after it included
    assert cached[0] is None
    records, mark = cached[1]
    assert [(r["metadata"]["name"], r["metadata"]["labels"].get("i")) for r in records] == [
        ("b", "after")
    ]
    listed = core.list_namespaced_pod(NS, label_selector="ray.io/cluster=c")
    assert mark == pods_mark(
        {"name": p.metadata.name, "resourceVersion": p.metadata.resource_version}
        for p in listed.items
    )
    # PodWatch heard the 410 too, and listed again (its second list)
    gone = f"resourceVersion {held.version} is gone (410 Expired: The resourceVersion"
    assert any(m.startswith(f"pod-watch-{NS}: {gone}") for m in said), said
    assert any(m.endswith("listing again") for m in said), said
    assert held.lists == 2, said
    print(f"etcd compacted the held version {compacted_after:.1f} s after the changes")
