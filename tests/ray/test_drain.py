"""`drain_node()` against a real Ray 2.60 (docs/design/ray-protocol.md §7): an idle Raylet
accepts and ends, a busy one refuses in Ray's words, a dead or unknown node is accepted.

Its own small cluster: a drained Raylet is gone for good, so the package's shared
cluster is left alone."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from raysize.activities.ray_gcs import RayGcsClient
from raysize.activities.ray_state import NodeStatus
from raysize.sandbox.localray import Driver, LocalRayCluster, wait_for
from tests.ray.conftest import FAST_HEALTH_CHECKS, short_tmp

HOLD_ONE_CPU = """
import json, time
import ray

ray.init()

@ray.remote(num_cpus=1, max_retries=0)
def hold():
    time.sleep(600)

ref = hold.remote()
print(json.dumps({"event": "submitted"}), flush=True)
input()
"""


@pytest.fixture(scope="module")
def three_workers() -> Iterator[tuple[LocalRayCluster, RayGcsClient, dict[str, str]]]:
    root = short_tmp()
    ray = LocalRayCluster(root=root, env=dict(FAST_HEALTH_CHECKS))
    try:
        ray.start_head()
        ray.wait_alive(["head-0"])
        for pod in ("idle", "busy", "dies"):
            ray.add_worker(pod, "cpu-group")
        state = ray.wait_alive(["head-0", "idle", "busy", "dies"])
        ids = {n.pod: n.node_id for n in state.nodes if n.alive}
        with ray.client() as gcs:
            yield ray, gcs, ids
    finally:
        ray.stop()
        shutil.rmtree(root, ignore_errors=True)


def status_of(gcs: RayGcsClient, node_id: str) -> NodeStatus | None:
    return next((n.status for n in gcs.cluster_state().nodes if n.node_id == node_id), None)


def test_an_idle_raylet_accepts_the_drain_and_ends(
    three_workers: tuple[LocalRayCluster, RayGcsClient, dict[str, str]],
) -> None:
    _ray, gcs, ids = three_workers
    reply = gcs.drain_node(ids["idle"], "raysize: idle 3s ≥ 2s")
    assert reply.accepted and reply.rejection == ""
    # it ends at once: Ray reports it dead, and it takes no work from here on
    wait_for(
        lambda: status_of(gcs, ids["idle"]) == NodeStatus.DEAD, timeout=10, what="the drained node"
    )
    # asked again (a retried activity): a dead node is accepted at once
    assert gcs.drain_node(ids["idle"], "again").accepted


def test_a_busy_raylet_refuses_the_drain_and_keeps_its_work(
    three_workers: tuple[LocalRayCluster, RayGcsClient, dict[str, str]],
) -> None:
    ray, gcs, _ids = three_workers
    with Driver(ray, HOLD_ONE_CPU) as driver:
        driver.expect("submitted")
        busy = wait_for(
            lambda: next(
                (
                    n
                    for n in gcs.cluster_state().nodes
                    # the one whose only CPU the task holds (a node also reads as not idle
                    # for a moment while Ray starts a worker process on it)
                    if n.pod in ("busy", "dies") and n.alive and n.available.cpu == 0
                ),
                None,
            ),
            timeout=30,
            what="a worker running the task",
        )
        reply = gcs.drain_node(busy.node_id, "raysize: idle")
        assert not reply.accepted
        assert reply.rejection == "The node to be idle terminated is no longer idle."
        assert status_of(gcs, busy.node_id) in (NodeStatus.RUNNING, NodeStatus.IDLE)
        assert driver.proc.poll() is None  # its task still runs


def test_a_dead_or_unknown_node_is_accepted(
    three_workers: tuple[LocalRayCluster, RayGcsClient, dict[str, str]],
) -> None:
    ray, gcs, ids = three_workers
    assert gcs.drain_node("ab" * 28, "never registered").accepted
    node = next(n for n in ray.nodes if n.pod == "dies")
    node.kill()
    wait_for(
        lambda: status_of(gcs, ids["dies"]) == NodeStatus.DEAD, timeout=30, what="the killed node"
    )
    assert gcs.drain_node(ids["dies"], "dead").accepted
