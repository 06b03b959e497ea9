"""The shared pod watch: resize waits hear the kubelet through one watch, not by polling."""

from __future__ import annotations

import asyncio
import time

from temporalio.testing import ActivityEnvironment

from raysize.activities.k8s_activities import K8sActivities
from raysize.activities.pod_watch import PodWatch
from raysize.sandbox.faults import FaultRule
from raysize.workflows.contracts import ApplyResizeInput, ProgressState
from raysize.workflows.ippr_status import IpprStatus
from raysize.workflows.resources import GIB

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
