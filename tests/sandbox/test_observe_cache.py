"""The observe reads a cluster's pods from the pod watch's cache, in both worlds (the real
kube-apiserver and KubeRay decide): no pod LIST once the watch is synced, every change
seen, this process's own writes never missed, a LIST while the watch cannot answer."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from kubernetes import client

from bench.clusters import small_raycluster
from raysize.activities import pod_watch
from raysize.activities.k8s import Kube
from raysize.activities.k8s_objects import KubeCluster
from raysize.activities.pod_watch import PodWatch
from raysize.workflows.ippr_status import IpprStatus

from .conftest import client_for, pod_body, wait_for
from .test_pod_watch import HeldWatches

RC = "cached"


class Gated:
    """A watch's answer whose events reach the client only while `flowing` is set: the
    watch stays connected but falls behind the server (as a slow one does)."""

    def __init__(self, resp: Any, flowing: threading.Event) -> None:
        self.resp, self.flowing = resp, flowing

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        for segment in self.resp.stream(*args, **kwargs):
            self.flowing.wait(60)
            yield segment

    def __getattr__(self, name: str) -> Any:
        return getattr(self.resp, name)


class CountedPods:
    """The client's pod calls, counted: LISTs (what the cache replaces) and watches; the
    watches' events held back while `flowing` is clear."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core
        self.lists = 0
        self.watches = 0
        self.flowing = threading.Event()
        self.flowing.set()
        self.connecting = threading.Event()  # clear: a watch waits before it connects
        self.connecting.set()

    def list_namespaced_pod(self, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("watch"):
            self.lists += 1
            return self.core.list_namespaced_pod(*args, **kwargs)
        self.connecting.wait(60)
        self.watches += 1
        return Gated(self.core.list_namespaced_pod(*args, **kwargs), self.flowing)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.core, name)


def view(cluster: KubeCluster) -> list[tuple[str, str, str, str, int, str]]:
    """What an observe plans on of each pod (and its raysize record)."""
    return sorted(
        (p.name, p.uid, p.group, p.phase.value, p.total.cpu, str(p.raylet_id)) for p in cluster.pods
    )


def settled(kube: Kube, plain: Kube, ns: str) -> KubeCluster:
    """The cluster from a LIST (`plain`'s, not counted) once `kube`'s cached read agrees
    with it (the watch is a few milliseconds behind a change)."""
    fresh: list[KubeCluster] = []

    def same() -> bool:
        fresh[:] = [plain.read_cluster(ns, RC)]
        return kube.read_cluster(ns, RC, cached=True).pods_version == fresh[0].pods_version

    wait_for(same, 20, 0.1)
    return fresh[0]


def quiet_reads(kube: Kube, plain: Kube, ns: str) -> tuple[KubeCluster, list[KubeCluster]]:
    """A LIST, and three cached reads while the pods stayed as that LIST saw them (checked
    by a LIST after them). The kubelet may still be starting a pod when the watch first
    agrees with a LIST (a loaded machine took seconds), and the comparison is only fair
    with no change in between: it is tried again, for up to 20 s, until none came."""
    for _ in range(100):
        listed = settled(kube, plain, ns)
        cached = [kube.read_cluster(ns, RC, cached=True) for _ in range(3)]
        if plain.read_cluster(ns, RC).pods_version == listed.pods_version:
            return listed, cached
        time.sleep(0.2)
    raise AssertionError("the cluster's pods kept changing for 20 s")


def test_a_synced_watch_serves_the_observe_without_a_pod_list(kube, ns) -> None:
    """The first observe LISTs (the watch is starting); once it is synced, observes list
    no pods, and a pod created, changed or deleted by anyone is seen without one. A pod
    this process writes is in the very next observe even while the watch has not
    delivered it: that read LISTs rather than answer from before the write."""
    custom = client.CustomObjectsApi(kube)
    custom.create_namespaced_custom_object(
        "ray.io", "v1", ns, "rayclusters", small_raycluster(RC, workers=2)
    )
    counted = CountedPods(client.CoreV1Api(kube))
    plain = Kube(kube)  # the test's own reads: not counted
    k = Kube(kube)
    k.core = counted  # type: ignore[assignment]
    watch = PodWatch(counted)
    k.pod_watch = watch
    try:
        wait_for(lambda: len(plain.read_cluster(ns, RC).pods) == 3, 60, 0.2)  # head + 2
        counted.connecting.clear()  # the watch lists, and does not connect yet
        first = k.read_cluster(ns, RC, cached=True)  # starts the watch: not synced
        assert watch.uncached_reads == 1 and len(first.pods) == 3  # from a LIST
        wait_for(lambda: counted.lists == 2)  # the fallback's, and the watch's own
        assert not watch.synced(ns)
        assert len(k.read_cluster(ns, RC, cached=True).pods) == 3
        assert (watch.uncached_reads, counted.lists) == (2, 3)  # listed, not connected
        counted.connecting.set()
        wait_for(lambda: watch.synced(ns), 20)
        lists = counted.lists
        listed, cached = quiet_reads(k, plain, ns)
        assert counted.lists == lists  # no pod LIST for a synced watch's observes
        assert all(view(c) == view(listed) for c in cached)
        assert cached[0].pods_version == listed.pods_version  # the wait's mark: the same
        assert watch.cluster_pods_mark(ns, RC) == listed.pods_version

        # created, changed, deleted by someone else: seen, with no LIST
        counted.core.create_namespaced_pod(ns, pod_body("extra", labels={"ray.io/cluster": RC}))

        def names() -> set[str]:
            return {p.name for p in k.read_cluster(ns, RC, cached=True).pods}

        wait_for(lambda: "extra" in names())
        counted.core.patch_namespaced_pod("extra", ns, {"metadata": {"labels": {"i": "1"}}})
        wait_for(
            lambda: any(p.labels.get("i") == "1" for p in k.read_cluster(ns, RC, cached=True).pods)
        )
        counted.core.delete_namespaced_pod("extra", ns, grace_period_seconds=0)
        wait_for(lambda: "extra" not in names())
        assert counted.lists == lists
        listed = settled(k, plain, ns)
        assert counted.lists == lists

        # our own write while the watch is behind: the next observe must not answer from
        # before it (it waits for the watch a moment, then LISTs)
        watch.write_wait_s = 0.3
        worker = next(p for p in listed.pods if p.group == "small")
        counted.flowing.clear()
        k.set_ippr_status(ns, worker.name, IpprStatus(raylet_id="ab" * 28), worker.uid)
        after_write = k.read_cluster(ns, RC, cached=True)
        seen = next(p for p in after_write.pods if p.name == worker.name)
        assert seen.raylet_id == "ab" * 28  # not the cache's copy from before the write
        assert counted.lists == lists + 1  # from a LIST: the watch was behind
        counted.flowing.set()
        wait_for(lambda: watch.cluster_pods_mark(ns, RC) == after_write.pods_version)
        again = k.read_cluster(ns, RC, cached=True)  # the watch has it: from the cache
        assert next(p for p in again.pods if p.name == worker.name).raylet_id == "ab" * 28
        assert counted.lists == lists + 1
    finally:
        counted.flowing.set()
        counted.connecting.set()
        watch.close()
        custom.delete_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", RC)


def test_an_observe_waits_for_the_watch_to_bring_its_own_write_instead_of_listing(kube, ns) -> None:
    """`PodWatch.delivered`, which the observe awaits before its read: while the watch is
    behind this process's write it waits on the event loop (no thread of the API
    server's), and once the watch delivers the write the read answers from the cache,
    with no LIST. Under a 1,000-cluster burst each read that listed instead took ~11 s."""
    custom = client.CustomObjectsApi(kube)
    custom.create_namespaced_custom_object(
        "ray.io", "v1", ns, "rayclusters", small_raycluster(RC, workers=2)
    )
    counted = CountedPods(client.CoreV1Api(kube))
    plain = Kube(kube)
    k = Kube(kube)
    k.core = counted  # type: ignore[assignment]
    watch = PodWatch(counted)
    k.pod_watch = watch
    try:
        wait_for(lambda: len(plain.read_cluster(ns, RC).pods) == 3, 60, 0.2)
        assert asyncio.run(watch.delivered(ns, RC, 5)) is False  # not synced: list at once
        wait_for(lambda: watch.synced(ns), 20)
        listed = settled(k, plain, ns)
        assert asyncio.run(watch.delivered(ns, RC, 5)) is True  # nothing of ours pending
        worker = next(p for p in listed.pods if p.group == "small")
        counted.flowing.clear()  # the watch falls behind
        k.set_ippr_status(ns, worker.name, IpprStatus(raylet_id="cd" * 28), worker.uid)
        assert asyncio.run(watch.delivered(ns, RC, 0.3)) is False  # behind for 0.3 s

        async def behind_then_caught_up() -> bool:
            waiting = asyncio.ensure_future(watch.delivered(ns, RC, 20))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            counted.flowing.set()
            return await waiting

        lists = counted.lists
        assert asyncio.run(behind_then_caught_up()) is True
        seen = k.read_cluster(ns, RC, cached=True)
        assert next(p for p in seen.pods if p.name == worker.name).raylet_id == "cd" * 28
        assert counted.lists == lists  # from the cache: the write came through the watch
    finally:
        counted.flowing.set()
        watch.close()
        custom.delete_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", RC)


def test_after_a_410_the_cache_lists_again_and_is_right(make_sandbox, tmp_path) -> None:
    """While the watch is away the observe LISTs; the watch comes back to a 410 (its
    version is out of the server's window), lists again, and the cache then answers as
    the server does, a deletion and the last of many patches included."""
    sb = make_sandbox(watch_history=5)  # a watch from before the last 5 events is 410
    core = client.CoreV1Api(client_for(sb, tmp_path))
    labels = {"ray.io/cluster": RC, "ray.io/group": "g"}
    for name in ("a", "b"):
        core.create_namespaced_pod("default", pod_body(name, labels=dict(labels)))
    held = HeldWatches(core)
    k = Kube(core.api_client)
    k.core = held  # type: ignore[assignment]
    watch = PodWatch(held, timeout_s=1)  # each watch ends after a second, and is resumed
    k.pod_watch = watch
    try:

        def agrees() -> bool:
            return (
                k.cluster_pods("default", RC, cached=True)[1]
                == (k.list_cluster_pods("default", RC)[1])
            )

        assert k.cluster_pods("default", RC, cached=True)[0]  # a LIST: starting
        wait_for(lambda: watch.synced("default") and agrees(), 20)
        held.open.clear()  # the next connection waits: the watch is away
        wait_for(held.held.is_set, 10)
        assert not watch.synced("default")
        core.delete_namespaced_pod("a", "default", grace_period_seconds=0)
        for i in range(8):  # more than the window holds
            core.patch_namespaced_pod("b", "default", {"metadata": {"labels": {"i": str(i)}}})
        misses = watch.uncached_reads
        pods, _ = k.cluster_pods("default", RC, cached=True)  # away: a LIST, and right
        assert watch.uncached_reads == misses + 1
        assert [p["metadata"]["name"] for p in pods] == ["b"]
        assert pods[0]["metadata"]["labels"]["i"] == "7"

        lists = held.lists
        watch.timeout_s = 300  # the watches from here on last: no reconnect in the reads
        held.open.set()  # back to a 410, then a list
        wait_for(lambda: held.lists > lists and watch.synced("default"), 20)
        lists, hits = held.lists, watch.cached_reads
        pods, mark = k.cluster_pods("default", RC, cached=True)
        assert (held.lists, watch.cached_reads) == (lists, hits + 1)  # the cache's answer
        assert [p["metadata"]["name"] for p in pods] == ["b"]
        assert pods[0]["metadata"]["labels"]["i"] == "7"
        assert mark == k.list_cluster_pods("default", RC)[1]
    finally:
        watch.close()


class PagedPods:
    """The client's pod calls; the LISTs' page sizes recorded, and `between` run once,
    after the first page of a paged LIST is answered."""

    def __init__(self, core: client.CoreV1Api, between: Any) -> None:
        self.core, self.between = core, between
        self.pages: list[int | None] = []

    def list_namespaced_pod(self, *args: Any, **kwargs: Any) -> Any:
        answer = self.core.list_namespaced_pod(*args, **kwargs)
        if not kwargs.get("watch"):
            self.pages.append(kwargs.get("limit"))
            if kwargs.get("limit") == 2 and self.between is not None:  # the watch's pages
                between, self.between = self.between, None
                between()
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.core, name)


def test_the_watch_lists_in_pages_and_misses_nothing_changed_between_them(
    kube, ns, monkeypatch
) -> None:
    """The watch's LIST comes in pages (parsed whole, 5,000 KubeRay pods left the worker
    160 MB bigger). Pods deleted, changed and created between two pages are all right in
    the cache once it is synced: the watch starts at the first page's resourceVersion."""
    monkeypatch.setattr(pod_watch, "LIST_PAGE", 2)
    core = client.CoreV1Api(kube)
    labels = {"ray.io/cluster": RC, "ray.io/group": "g"}
    for i in range(5):
        core.create_namespaced_pod(ns, pod_body(f"p{i}", labels=dict(labels)))

    def between() -> None:
        core.delete_namespaced_pod("p0", ns, grace_period_seconds=0)  # sent in page 1
        core.patch_namespaced_pod("p4", ns, {"metadata": {"labels": {"i": "1"}}})  # page 3
        core.create_namespaced_pod(ns, pod_body("p9", labels=dict(labels)))

    paged = PagedPods(core, between)
    k, plain = Kube(kube), Kube(kube)
    k.core = paged  # type: ignore[assignment]
    watch = PodWatch(paged)
    k.pod_watch = watch
    try:
        k.cluster_pods(ns, RC, cached=True)  # starts the watch (a LIST of its own)

        def right() -> bool:
            if not watch.synced(ns):
                return False
            pods, mark = k.cluster_pods(ns, RC, cached=True)
            return mark == plain.list_cluster_pods(ns, RC)[1] and (
                sorted(p["metadata"]["name"] for p in pods) == ["p1", "p2", "p3", "p4", "p9"]
            )

        wait_for(right, 30, 0.1)
        pods, _ = k.cluster_pods(ns, RC, cached=True)
        assert (
            next(p for p in pods if p["metadata"]["name"] == "p4")["metadata"]["labels"]["i"] == "1"
        )
        assert paged.pages.count(2) >= 3  # the watch's list: three pages of two
    finally:
        watch.close()
