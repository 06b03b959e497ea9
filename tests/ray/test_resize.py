"""`resize_raylet()` against a real Ray 2.60: upsizing runs work, downsizing clamps."""

from __future__ import annotations

import os

import pytest

from raysize.activities.ray_gcs import RayGcsClient, RayletNotFound
from raysize.sandbox.localray import Driver, LocalRayCluster, holding_one_cpu, wait_for
from raysize.workflows.resources import Resources
from tests.ray.conftest import WORKER_MEMORY

PENDING_TWO_CPU_TASK = """
import json
import ray

ray.init()

@ray.remote(num_cpus=2)
def multiply(x):
    return {"value": x * 7, "node": ray.get_runtime_context().get_node_id()}

ref = multiply.remote(6)
print(json.dumps({"event": "submitted"}))
print(json.dumps({"event": "done", **ray.get(ref)}))
input()
"""


def test_upsizing_a_worker_runs_a_pending_two_cpu_task(
    cluster: LocalRayCluster,
    gcs: RayGcsClient,
    worker_ids: dict[str, str],
    restore_workers: None,
) -> None:
    worker = worker_ids["worker-1"]
    with Driver(cluster, PENDING_TWO_CPU_TASK) as driver:
        driver.expect("submitted")
        wait_for(
            lambda: any(d.shape.cpu == 2000 for d in gcs.cluster_state().demands),
            timeout=30,
            what="the 2-CPU task to be reported pending",
        )

        applied = gcs.resize_raylet(worker, 4, 4_000_000_000)

        assert (applied.cpu, applied.memory) == (4000, 4_000_000_000)
        done = driver.expect("done", timeout=60)
        assert done["value"] == 42
        assert done["node"] == worker
    node = wait_for(
        lambda: next(n for n in gcs.cluster_state().nodes if n.node_id == worker).total.cpu == 4000,
        timeout=10,
        what="the GCS to see the new total",
    )
    assert node


def test_downsizing_below_what_is_in_use_returns_the_clamped_totals(
    cluster: LocalRayCluster,
    gcs: RayGcsClient,
    worker_ids: dict[str, str],
    restore_workers: None,
) -> None:
    worker = worker_ids["worker-2"]
    with holding_one_cpu(cluster, gcs, worker):
        applied = gcs.resize_raylet(worker, 0.5, 500_000_000)

        # The Raylet keeps what the task holds: 1 CPU and 600 MB, not what was asked.
        assert (applied.cpu, applied.memory) == (1000, 600_000_000)

    def shrunk() -> Resources | None:
        applied = gcs.resize_raylet(worker, 0.5, 500_000_000)
        return applied if applied.cpu == 500 else None

    applied = wait_for(shrunk, timeout=30, what="the resize to apply once the task is gone")
    assert applied.memory == 500_000_000


def test_an_unknown_node_is_raylet_not_found(gcs: RayGcsClient) -> None:
    unknown = os.urandom(28).hex()
    with pytest.raises(RayletNotFound, match=f"Raylet {unknown} is not alive") as caught:
        gcs.resize_raylet(unknown, 1, WORKER_MEMORY)
    assert caught.value.retryable is False
