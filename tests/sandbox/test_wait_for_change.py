"""The reconcile loop's wait: quiet until the tick passes, awake at once when a pod of the
cluster changes or Ray cannot be read."""

from __future__ import annotations

import asyncio
import time

from temporalio.testing import ActivityEnvironment

from activities.cluster import ClusterActivities, RaySettings, fingerprint
from activities.ray_gcs import RayGcsClient
from sandbox.gcs_standin import GcsStandIn
from sandbox.rayprocs import free_port
from workflows.contracts import WaitInput

from .test_k8s_activities import env, workers

__all__ = ["env"]  # the sandbox with a RayCluster "rc" of two workers


def wait_input(kube, gcs: str, timeout_s: float) -> WaitInput:
    with RayGcsClient(gcs) as ray:
        version = fingerprint(ray.cluster_state())
    return WaitInput(
        namespace="default",
        cluster="rc",
        gcs_address=gcs,
        gcs_version=version,
        pods_version=kube.read_cluster("default", "rc").pods_version,
        timeout_s=timeout_s,
    )


def test_quiet_until_the_tick_then_awake_when_a_pod_changes(env):
    _, kube = env
    with GcsStandIn() as gcs:
        acts = ClusterActivities(kube=kube, ray=RaySettings())
        try:
            started = time.monotonic()
            quiet = asyncio.run(
                ActivityEnvironment().run(acts.wait_for_change, wait_input(kube, gcs.address, 1.5))
            )
            assert quiet is False and time.monotonic() - started >= 1.5

            async def change_a_pod() -> bool:
                waiting = asyncio.ensure_future(
                    ActivityEnvironment().run(
                        acts.wait_for_change, wait_input(kube, gcs.address, 30)
                    )
                )
                await asyncio.sleep(0.5)
                pod = workers(kube)[0]
                await asyncio.to_thread(
                    kube.core.patch_namespaced_pod,
                    pod,
                    "default",
                    {"metadata": {"labels": {"touched": "yes"}}},
                )
                return await asyncio.wait_for(waiting, 10)  # not the 30 s tick

            assert asyncio.run(change_a_pod()) is True
        finally:
            acts.close()


def test_awake_at_once_when_ray_cannot_be_read(env):
    _, kube = env
    with GcsStandIn() as gcs:
        inp = wait_input(kube, gcs.address, 30)
    # the stand-in is gone: the next observe must say what is wrong, now
    acts = ClusterActivities(kube=kube, ray=RaySettings(timeout_s=1))
    try:
        inp = inp.model_copy(update={"gcs_address": f"127.0.0.1:{free_port()}"})
        started = time.monotonic()
        assert asyncio.run(ActivityEnvironment().run(acts.wait_for_change, inp)) is True
        assert time.monotonic() - started < 10
    finally:
        acts.close()
