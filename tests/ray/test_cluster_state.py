"""`cluster_state()` and `nodes()` against a real Ray 2.60 (the session cluster)."""

from __future__ import annotations

from raysize.activities.ray_gcs import RayGcsClient
from raysize.activities.ray_state import ClusterState, NodeStatus
from raysize.sandbox.localray import Driver, LocalRayCluster, wait_for
from raysize.workflows.model import GangStrategy
from raysize.workflows.resources import Resources
from tests.ray.conftest import GROUP, WORKER_MEMORY, WORKERS

DEMANDS = """
import json, sys, time
import ray
from ray.autoscaler.sdk import request_resources
from ray.util.placement_group import placement_group

ray.init()

@ray.remote(num_cpus=2)
def two_cpus():
    return 1

tasks = [two_cpus.remote() for _ in range(3)]
selected = two_cpus.options(label_selector={"group": "cpu"}).remote()
pack = placement_group([{"CPU": 3}, {"CPU": 1}], strategy="PACK")
spread = placement_group([{"CPU": 5}, {"CPU": 5}], strategy="STRICT_SPREAD")
request_resources(num_cpus=6, bundles=[{"CPU": 4, "memory": 10**9}])
print(json.dumps({"event": "submitted", "pack": pack.id.hex(), "spread": spread.id.hex()}))
for line in sys.stdin:
    if line.strip() == "clear":
        request_resources(num_cpus=0)
        print(json.dumps({"event": "cleared"}))
"""


def test_nodes_are_listed_with_pod_names_groups_and_exact_totals(gcs: RayGcsClient) -> None:
    state = gcs.cluster_state()
    by_pod = {n.pod: n for n in state.alive_nodes}
    assert {"head-0", *WORKERS} <= set(by_pod)
    assert by_pod["head-0"].group == "headgroup"
    for pod in WORKERS:
        node = by_pod[pod]
        assert node.group == GROUP
        assert len(node.node_id) == 56
        assert node.status in (NodeStatus.IDLE, NodeStatus.RUNNING)
        assert node.total.cpu == 1000 and node.total.memory == WORKER_MEMORY
        assert node.labels["pod"] == pod
        assert node.labels["ray.io/node-group"] == GROUP
    assert by_pod["head-0"].total.cpu == 0

    infos = {n.pod: n for n in gcs.nodes(alive_only=True)}
    assert infos["head-0"].is_head and not infos["worker-1"].is_head
    assert infos["worker-1"].node_id == by_pod["worker-1"].node_id
    assert infos["worker-1"].raylet_port > 0 and infos["worker-1"].alive


def test_pending_tasks_placement_groups_and_constraints_appear_with_exact_counts(
    cluster: LocalRayCluster, gcs: RayGcsClient, restore_workers: None
) -> None:
    with Driver(cluster, DEMANDS) as driver:
        ids = driver.expect("submitted")

        def everything_pending() -> ClusterState | None:
            # the driver's submissions reach the Raylet, and its report the GCS, one by
            # one: wait for all four tasks (on a loaded machine a read once saw 2 of 3)
            state = gcs.cluster_state()
            ok = (
                len(state.demands) == 2
                and sum(d.count for d in state.demands) == 4
                and len(state.gangs) == 2
                and state.constraints
            )
            return state if ok else None

        state = wait_for(everything_pending, timeout=30, what="demands, gangs and constraints")

        plain = next(d for d in state.demands if not d.label_selectors)
        assert (plain.shape, plain.count) == (Resources.of(cpu=2000), 3)
        selected = next(d for d in state.demands if d.label_selectors)
        assert (selected.shape, selected.count) == (Resources.of(cpu=2000), 1)
        (constraint,) = selected.label_selectors[0].constraints
        assert (constraint.key, constraint.operator.value, constraint.values) == (
            "group",
            "in",
            ("cpu",),
        )

        gangs = {g.placement_group_id: g for g in state.gangs}
        pack = gangs[ids["pack"]]
        assert (pack.strategy, pack.state) == (GangStrategy.PACK, "PENDING")
        assert [b.shape for b in pack.bundles] == [Resources.of(cpu=3000), Resources.of(cpu=1000)]
        spread = gangs[ids["spread"]]
        assert spread.strategy is GangStrategy.STRICT_SPREAD
        assert [b.shape for b in spread.bundles] == [Resources.of(cpu=5000)] * 2
        # Ray expresses STRICT_SPREAD as anti-affinity to the group's own label.
        assert all(b.placement_constraints for b in spread.bundles)
        assert all(
            not c.affinity and c.label == f"_PG_{ids['spread']}"
            for b in spread.bundles
            for c in b.placement_constraints
        )

        assert sorted((c.shape.cpu, c.shape.memory, c.count) for c in state.constraints) == [
            (1000, 0, 6),
            (4000, 10**9, 1),
        ]

        driver.send("clear")
        driver.expect("cleared")
        wait_for(
            lambda: not gcs.cluster_state().constraints,
            timeout=10,
            what="request_resources(num_cpus=0) to clear the constraint",
        )


def test_the_ray_version_is_the_one_the_head_recorded(gcs: RayGcsClient) -> None:
    """What `raysize doctor` reports: the cluster metadata Ray keeps in the GCS's store."""
    from importlib.metadata import version

    assert gcs.ray_version() == version("ray")
