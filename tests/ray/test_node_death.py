"""A Raylet killed without notice: first unreachable (retry), then dead (do not retry)."""

from __future__ import annotations

import pytest

from raysize.activities.ray_gcs import RayGcsClient, RayletNotFound, RayUnavailable
from raysize.activities.ray_state import NodeDeathReason, NodeStatus, RayNode
from raysize.sandbox.localray import LocalRayCluster, wait_for


def test_a_killed_raylet_is_retryable_until_the_gcs_declares_it_dead(
    cluster: LocalRayCluster, gcs: RayGcsClient
) -> None:
    doomed = cluster.add_worker("doomed-0", "cpu-group")
    try:
        state = cluster.wait_alive(["doomed-0"])
        node = state.node_for_pod("doomed-0")
        assert node is not None
        doomed.kill()

        # The GCS does not know yet; it keeps trying the Raylet until our deadline.
        with pytest.raises(RayUnavailable) as caught:
            gcs.resize_raylet(node.node_id, 2, 1_000_000_000, timeout=1.0)
        assert caught.value.retryable is True

        def dead() -> RayNode | None:
            found = next(n for n in gcs.cluster_state().nodes if n.node_id == node.node_id)
            return found if found.status is NodeStatus.DEAD else None

        found = wait_for(dead, timeout=30, what="the GCS to declare doomed-0 dead")
        assert found.pod == "doomed-0" and not found.alive
        info = next(n for n in gcs.nodes() if n.node_id == node.node_id)
        assert not info.alive
        assert info.death_reason is NodeDeathReason.UNEXPECTED_TERMINATION
        assert node.node_id not in {n.node_id for n in gcs.nodes(alive_only=True)}

        with pytest.raises(RayletNotFound, match="is not alive") as caught_dead:
            gcs.resize_raylet(node.node_id, 2, 1_000_000_000)
        assert caught_dead.value.retryable is False
    finally:
        doomed.kill()
