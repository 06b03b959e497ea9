"""One API server's threads are shared fairly (activities/targets.py `_Queue`): a saga's
writes go before the reads waiting, and the clusters take turns, so a noisy cluster's
hundreds of queued reads do not hold another cluster's saga write (it failed unsent after
its 10 s wait) nor its reads. Measured by the order the calls reach the API server, with
a call that holds the server's one thread until the test lets it go: no timing."""

from __future__ import annotations

import asyncio
import threading
import time

from raysize.activities.k8s_activities import K8sActivities
from raysize.activities.targets import Load, Targets, calls_of
from raysize.workflows.contracts import (
    ProgressState,
    ResizeProgress,
    ScaleInput,
    SetStatusInput,
    WaitResizeInput,
)
from raysize.workflows.ippr_status import IpprStatus

NOISY_READS = 300


class OrderedKube:
    """The calls K8sActivities makes, answered at once, in the order they reach the
    server."""

    host = "https://api.example:6443"
    timeout_s = None  # no wait bound: the test decides when the server's thread is free

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def _note(self, what: str, pod: str) -> None:
        with self._lock:
            self.sent.append((what, pod))

    def resize_progress(self, namespace, pod, cpu, memory, generation, uid=""):
        self._note("read", pod)
        return ResizeProgress(state=ProgressState.DONE)

    def set_ippr_status(self, namespace, pod, status, uid=""):
        self._note("status", pod)
        return {"metadata": {"name": pod}}

    def scale(self, namespace, cluster, replicas, workers_to_delete, generation, pod_uids, sizes):
        self._note("scale", cluster)
        return True


async def until_async(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        await asyncio.sleep(0.01)


def read(pod: str) -> WaitResizeInput:
    cluster = pod.split("-")[0]
    return WaitResizeInput(
        namespace="ns", cluster=cluster, pod=pod, cpu=1000, memory=1 << 30, generation=1,
        window_s=0.0,
    )  # fmt: skip


def test_a_quiet_clusters_saga_writes_and_reads_go_ahead_of_a_noisy_clusters_queue():
    """One thread (so the order is the queue's), held while the noisy cluster queues 300
    reads (its sagas' pod reads), then the quiet clusters queue a status write, a scale
    write and a read each. Before: one FIFO, so every quiet call came after the 300 noisy
    reads (a status write 301st; with 8 threads and 10 s each, failed unsent)."""
    kube = OrderedKube()
    targets = Targets(kube_threads=1)
    acts = K8sActivities(kube, pods=None, targets=targets)
    hold = threading.Event()
    name = f"kube {kube.host}"

    async def scenario() -> None:
        held = asyncio.ensure_future(targets.on_kube(kube, hold.wait))
        await until_async(lambda: targets.load().get(name) == Load(1, 0, 1))
        noisy = [
            asyncio.ensure_future(acts.wait_resize(read(f"noisy-worker-{i}")))
            for i in range(NOISY_READS)
        ]
        await until_async(lambda: targets.load()[name].waiting == NOISY_READS)
        quiet = []
        for c in ("quiet1", "quiet2"):
            quiet.append(asyncio.ensure_future(acts.wait_resize(read(f"{c}-worker-0"))))
            quiet.append(
                asyncio.ensure_future(
                    acts.set_status(
                        SetStatusInput(
                            namespace="ns", cluster=c, pod=f"{c}-worker-1", status=IpprStatus()
                        )
                    )
                )
            )
            quiet.append(
                asyncio.ensure_future(
                    acts.scale_groups(
                        ScaleInput(
                            namespace="ns", cluster=c, replicas={"w": 1}, workers_to_delete={}
                        )
                    )
                )
            )
        await until_async(lambda: targets.load()[name].waiting == NOISY_READS + 6)
        hold.set()
        await asyncio.gather(held, *noisy, *quiet)

    try:
        asyncio.run(scenario())
    finally:
        targets.close()
    assert len(kube.sent) == NOISY_READS + 6
    # the saga writes first, whatever waited before them, the clusters in turn
    assert kube.sent[:4] == [
        ("status", "quiet1-worker-1"),
        ("status", "quiet2-worker-1"),
        ("scale", "quiet1"),
        ("scale", "quiet2"),
    ]
    # then the reads, one per cluster in turn: each quiet cluster's read is among the
    # first of the round, not after the noisy cluster's 300
    reads = [pod for what, pod in kube.sent[4:]]
    assert reads[:3] == ["noisy-worker-0", "quiet1-worker-0", "quiet2-worker-0"]
    assert reads[3:] == [f"noisy-worker-{i}" for i in range(1, NOISY_READS)]


def test_calls_take_turns_by_cluster_and_writes_go_first():
    """The queue itself: keys in turn, one call each, in arrival order within a key; the
    writes before any read; a withdrawn call leaves the rest in order."""
    targets = Targets(kube_threads=1)
    hold = threading.Event()
    ran: list[str] = []

    async def call(tag: str, cluster: str, write: bool = False) -> None:
        calls_of("ns", cluster)  # as an activity does at its start
        await targets.kube("h", None, ran.append, tag, write=write)

    async def scenario() -> None:
        held = asyncio.ensure_future(targets.kube("h", None, hold.wait))
        await until_async(lambda: targets.load().get("kube h") == Load(1, 0, 1))
        jobs = [asyncio.ensure_future(call(f"a{i}", "a")) for i in range(4)]
        jobs += [asyncio.ensure_future(call(f"b{i}", "b")) for i in range(2)]
        withdrawn = asyncio.ensure_future(call("c0", "c"))
        jobs += [asyncio.ensure_future(call("c1", "c"))]
        jobs += [asyncio.ensure_future(call("aw", "a", write=True))]
        await until_async(lambda: targets.load()["kube h"].waiting == 9)
        withdrawn.cancel()
        await until_async(lambda: targets.load()["kube h"].waiting == 8)
        hold.set()
        await asyncio.gather(held, *jobs)

    try:
        asyncio.run(scenario())
    finally:
        targets.close()
    assert ran == ["aw", "a0", "b0", "c1", "a1", "b1", "a2", "a3"]
