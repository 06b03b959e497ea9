"""docs/design/ray-protocol.md §5.5, pinned: what makes Ray retry a placement group after a resize.

Findings (docs/design/ray-infeasible-pg.md): a placement group that no node could hold even
when empty is parked as INFEASIBLE and only a node *registering* with the GCS puts it
back in the queue; a resize does not. A placement group that merely waits for free
resources (NO_RESOURCES) is retried about once a second, so a resize is enough.
"""

from __future__ import annotations

import time

from raysize.activities.ray_gcs import RayGcsClient
from raysize.sandbox.localray import Driver, LocalRayCluster, wait_for

WATCH_PLACEMENT_GROUP = """
import json, sys, time
import ray
from ray.util.placement_group import placement_group, placement_group_table

ray.init()

@ray.remote(num_cpus=1)
def hold():
    time.sleep(3600)

if sys.argv[2] == "busy":
    held = [hold.remote() for _ in range(2)]
    while ray.available_resources().get("CPU", 0) > 0:
        time.sleep(0.1)

pg = placement_group(json.loads(sys.argv[1]), strategy="PACK")
print(json.dumps({"event": "created", "pg": pg.id.hex()}))
last = None
while True:
    table = placement_group_table(pg)
    now = (table["state"], table["stats"]["scheduling_state"])
    if now != last:
        print(json.dumps({"event": "state", "state": now[0], "scheduling": now[1]}))
        last = now
    if table["state"] == "CREATED":
        nodes = sorted(set(table["bundles_to_node_id"].values()))
        print(json.dumps({"event": "placed", "nodes": nodes}))
        break
    time.sleep(0.1)
input()
"""

# Longer than both the GCS retry interval of a pending group (<= 1 s) and the lag
# before the GCS sees a resize (about 1 s).
OBSERVE_S = 5.0


def _scheduling_state(driver: Driver) -> str:
    """The first verdict of the GCS scheduler (skipping QUEUED, before the first try)."""
    while True:
        state = str(driver.expect("state")["scheduling"])
        if state != "QUEUED":
            return state


def test_an_infeasible_group_is_retried_only_when_a_node_registers(
    cluster: LocalRayCluster,
    gcs: RayGcsClient,
    worker_ids: dict[str, str],
    restore_workers: None,
) -> None:
    worker = worker_ids["worker-1"]
    with Driver(cluster, WATCH_PLACEMENT_GROUP, args=('[{"CPU": 3}, {"CPU": 1}]', "idle")) as d:
        pg = d.expect("created")["pg"]
        # No node holds 3 CPUs even when empty: Ray parks the group as infeasible.
        assert _scheduling_state(d) == "INFEASIBLE"

        assert gcs.resize_raylet(worker, 4, 4_000_000_000).cpu == 4000
        wait_for(
            lambda: (
                next(n for n in gcs.cluster_state().nodes if n.node_id == worker).available.cpu
                == 4000
            ),
            timeout=10,
            what="the GCS to see 4 free CPUs on worker-1",
        )
        # The group now fits on worker-1, yet Ray does not try again.
        deadline = time.monotonic() + OBSERVE_S
        while time.monotonic() < deadline:
            assert pg in {g.placement_group_id for g in gcs.cluster_state().gangs}
            time.sleep(0.2)

        # Any new Raylet, even one with no CPU at all, makes the GCS retry it.
        kick = cluster.add_worker("pg-kick-0", "kick", cpus=0)
        try:
            cluster.wait_alive(["pg-kick-0"])
            placed = d.expect("placed", timeout=30)
        finally:
            kick.kill()
        assert placed["nodes"] == [worker]
        assert pg not in {g.placement_group_id for g in gcs.cluster_state().gangs}


def test_a_group_waiting_for_free_resources_is_placed_after_a_resize(
    cluster: LocalRayCluster,
    gcs: RayGcsClient,
    worker_ids: dict[str, str],
    restore_workers: None,
) -> None:
    worker = worker_ids["worker-1"]
    with Driver(cluster, WATCH_PLACEMENT_GROUP, args=('[{"CPU": 1}]', "busy")) as d:
        d.expect("created")
        # Both workers are busy but could hold the bundle: pending, retried with backoff.
        assert _scheduling_state(d) == "NO_RESOURCES"

        assert gcs.resize_raylet(worker, 2, 2_000_000_000).cpu == 2000

        assert d.expect("placed", timeout=15)["nodes"] == [worker]
