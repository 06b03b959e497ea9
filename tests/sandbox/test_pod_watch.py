"""The shared pod watch: resize waits hear the kubelet through one watch, not by polling."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from kubernetes import client
from temporalio.testing import ActivityEnvironment

from raysize.activities.k8s_activities import K8sActivities
from raysize.activities.pod_watch import PodWatch
from raysize.sandbox.faults import FaultRule
from raysize.workflows.contracts import ApplyResizeInput, ProgressState
from raysize.workflows.ippr_status import IpprStatus
from raysize.workflows.resources import GIB

from .conftest import client_for, pod_body, wait_for
from .test_k8s_activities import env, workers

__all__ = ["env"]  # the sandbox with a RayCluster of two workers


def count_requests(sb, verb: str) -> list[int]:
    """Counts requests of one verb to single pods (the polling a watch replaces)."""
    seen = [0]
    original = sb.faults.decide

    def decide(v: str, resource: str, name: str):
        if v == verb and resource == "pods" and name:
            seen[0] += 1
        return original(v, resource, name)

    sb.faults.decide = decide
    return seen


def test_a_resize_wait_is_woken_by_the_watch_without_polling(env):
    sb, kube = env
    pod = workers(kube)[0]
    sb.kubelet.timing.actuation_delay_s = 1.0  # long enough that polling would show
    pods = PodWatch(kube.core)
    try:
        acts = K8sActivities(kube, pods)
        gets = count_requests(sb, "get")
        started = time.monotonic()
        result = asyncio.run(
            ActivityEnvironment().run(
                acts.apply_resize,
                ApplyResizeInput(
                    namespace="default",
                    pod=pod,
                    cpu=2000,
                    memory=3 * GIB,
                    status=IpprStatus(resizing_at=1),
                    poll_interval_s=30,  # a read after 30 s of silence: never, here
                    window_s=20,
                ),
            )
        )
        took = time.monotonic() - started
    finally:
        pods.close()
    assert result.progress.state == ProgressState.DONE
    assert (result.progress.cpu, result.progress.memory) == (2000, 3 * GIB)
    assert took < 15  # woken by the change, not by a read after 30 s of silence
    assert gets[0] <= 2  # the read before the patch (and at most one more), no polling


def test_a_dropped_watch_reconnects_and_a_deleted_pod_ends_the_wait(env):
    sb, kube = env
    pod = workers(kube)[1]
    sb.kubelet.timing.actuation_delay_s = 2.0
    # every watch connection is cut after half a second
    sb.faults.add(FaultRule(verb="watch", resource="pods", watch_disconnect_after_s=0.5))
    pods = PodWatch(kube.core)
    try:
        acts = K8sActivities(kube, pods)
        inp = ApplyResizeInput(
            namespace="default",
            pod=pod,
            cpu=2000,
            memory=3 * GIB,
            status=IpprStatus(),
            window_s=20,
            poll_interval_s=30,
        )
        done = asyncio.run(ActivityEnvironment().run(acts.apply_resize, inp))
        assert done.progress.state == ProgressState.DONE  # heard across reconnects

        async def delete_while_waiting():
            wait = asyncio.ensure_future(
                ActivityEnvironment().run(
                    acts.apply_resize, inp.model_copy(update={"cpu": 3000, "window_s": 20})
                )
            )
            await asyncio.sleep(0.5)
            await asyncio.to_thread(kube.core.delete_namespaced_pod, pod, "default")
            return await asyncio.wait_for(wait, 15)

        gone = asyncio.run(delete_while_waiting())
    finally:
        pods.close()
    assert gone.progress.state == ProgressState.POD_GONE


class HeldWatches:
    """The client, with a hold on new watch connections: the test keeps the pod watch
    away from the server for a while (in the real world, while etcd compacts the version
    it will resume from). What the watch is answered is the server's own. It counts the
    lists, and keeps the version the held watch asks for."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core
        self.open = threading.Event()
        self.open.set()
        self.held = threading.Event()  # a watch connection is waiting for the hold to end
        self.version = ""  # where the held watch resumes
        self.watches = 0
        self.lists = 0

    def list_namespaced_pod(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("watch"):
            if not self.open.is_set():
                self.version = str(kwargs.get("resource_version") or "")
                self.held.set()
                self.open.wait(60)
            self.watches += 1
        else:
            self.lists += 1
        return self.core.list_namespaced_pod(*args, **kwargs)


async def heard(sub: Any, value: str) -> str:
    """The label `i` of the subscribed pod once it reads `value` (or what it reads after
    10 s of waiting for it)."""

    def label() -> str:
        return str(((sub.latest or {}).get("metadata") or {}).get("labels", {}).get("i", ""))

    for _ in range(100):
        if label() == value:
            break
        await sub.wait(0.1)
    return label()


def test_a_watch_whose_version_expired_lists_again_and_hears_what_changed(
    make_sandbox, tmp_path, caplog
):
    """The watch resumes from the last resourceVersion it saw; when the server has let it
    go (410 Gone: a full window, or etcd compacted it) it lists again and delivers what
    changed meanwhile, a deletion too. The 410 branch used to be dead: the client raised
    KeyError('raw_object') on the ERROR event (deserialize=False), and the watch started
    over from "now", so a pod deleted meanwhile was never heard of."""
    sb = make_sandbox(watch_history=5)  # the window: 5 events, then a watch from before is 410
    core = client.CoreV1Api(client_for(sb, tmp_path))
    for name in ("a", "b"):
        core.create_namespaced_pod("default", pod_body(name))
    held = HeldWatches(core)
    pods = PodWatch(held, timeout_s=1)  # each watch ends after a second, and is resumed

    async def run() -> tuple[bool, str, str]:
        with pods.subscribe("default", "a") as a, pods.subscribe("default", "b") as b:
            await asyncio.to_thread(wait_for, lambda: held.watches >= 1)
            held.open.clear()  # the next connection waits: the watch is away
            await asyncio.to_thread(wait_for, held.held.is_set, 10)
            core.delete_namespaced_pod("a", "default", grace_period_seconds=0)
            for i in range(8):  # more than the window holds
                core.patch_namespaced_pod("b", "default", {"metadata": {"labels": {"i": str(i)}}})
            a.event.clear()
            held.open.set()
            await a.wait(10)
            deleted = a.deleted

            seen = await heard(b, "7")  # the list's b, as the patches left it
            # and the watch goes on from the list
            core.patch_namespaced_pod("b", "default", {"metadata": {"labels": {"i": "after"}}})
            after = await heard(b, "after")
            return deleted, seen, after

    with caplog.at_level(logging.INFO, logger="raysize.activities"):
        try:
            deleted, seen, after = asyncio.run(run())
        finally:
            pods.close()
    said = [r.getMessage() for r in caplog.records]
    assert deleted is True, said
    assert seen == "7" and after == "after"
    assert any("410" in m and "listing again" in m for m in said), said
    assert not any("raw_object" in m for m in said), said
