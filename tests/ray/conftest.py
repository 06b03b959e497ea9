"""Fixtures for the tests against a real Ray: one session cluster, started and always stopped.

The session cluster is a head with no CPUs (so work lands on the workers, where the
tests expect it) and two workers, `worker-1` and `worker-2` of group `cpu-group`, each
with 1 CPU and 1 GB of logical memory. Tests that resize a worker restore it.
The GCS declares a Raylet dead after 3 missed 1 s health checks (Ray's default: 5 × 3 s).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raysize.activities.ray_gcs import RayError, RayGcsClient
from raysize.sandbox.localray import LocalRayCluster, wait_for
from raysize.workflows.resources import Resources

WORKERS = ("worker-1", "worker-2")
GROUP = "cpu-group"
WORKER_MEMORY = 1_000_000_000
FAST_HEALTH_CHECKS = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}


def short_tmp() -> Path:
    # Unix socket paths must stay under ~107 characters: keep the root short.
    return Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))


@pytest.fixture(autouse=True)
def _no_ambient_ray_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token or TLS setting in the developer's shell must not change what is tested."""
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_USE_TLS", "RAY_TLS_SERVER_NAME"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="package")
def cluster() -> Iterator[LocalRayCluster]:
    root = short_tmp()
    ray = LocalRayCluster(root=root, env=dict(FAST_HEALTH_CHECKS))
    try:
        ray.start_head()
        ray.wait_alive(["head-0"])
        for pod in WORKERS:
            ray.add_worker(pod, GROUP, labels={"pod": pod, "group": "cpu"})
        ray.wait_alive(["head-0", *WORKERS])
        yield ray
    finally:
        ray.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="package")
def gcs(cluster: LocalRayCluster) -> Iterator[RayGcsClient]:
    with cluster.client() as client:
        yield client


@pytest.fixture(scope="package")
def worker_ids(cluster: LocalRayCluster, gcs: RayGcsClient) -> dict[str, str]:
    state = gcs.cluster_state()
    ids = {}
    for pod in WORKERS:
        node = state.node_for_pod(pod)
        assert node is not None and node.alive
        ids[pod] = node.node_id
    return ids


# RequestClusterResourceConstraintRequest{cluster_resource_constraint: {}}, encoded by
# hand: field 1, length-delimited (tag 0x0a), length 0. raysize's protos leave this RPC
# out (only tests set constraints); its reply is an empty message.
EMPTY_CONSTRAINT_REQUEST = b"\x0a\x00"


def clear_constraints(address: str) -> None:
    """What `request_resources(num_cpus=0)` does: an empty cluster constraint."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            "/ray.rpc.autoscaler.AutoscalerStateService/RequestClusterResourceConstraint"
        )
        assert call(EMPTY_CONSTRAINT_REQUEST, timeout=5) == b""


@pytest.fixture
def restore_workers(gcs: RayGcsClient, worker_ids: dict[str, str]) -> Iterator[None]:
    """Put both workers back to 1 CPU / 1 GB after the test, once their tasks are gone."""
    yield
    original = Resources.of(cpu=1000, memory=WORKER_MEMORY)
    for node_id in worker_ids.values():

        def restored(node_id: str = node_id) -> bool:
            try:
                applied = gcs.resize_raylet(node_id, 1, WORKER_MEMORY)
            except RayError:
                return False
            return applied.cpu == original.cpu and applied.memory == original.memory

        wait_for(restored, timeout=60, what=f"worker {node_id[:12]} back to 1 CPU")

    def gcs_caught_up() -> bool:
        # The GCS's own view lags a resize by about a second: the next test reads it.
        totals = {n.node_id: n.total for n in gcs.cluster_state().nodes}
        return all(
            (totals[i].cpu, totals[i].memory) == (original.cpu, original.memory)
            for i in worker_ids.values()
        )

    wait_for(gcs_caught_up, timeout=30, what="the GCS to see the workers restored")
    clear_constraints(gcs.address)
