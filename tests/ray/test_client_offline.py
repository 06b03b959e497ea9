"""What the client decides without a Ray: reading replies, refusing bad input, tokens."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from raysize.activities.ray_gcs import (
    RayGcsClient,
    RayInvalidArgument,
    RayReplyError,
    RayUnauthenticated,
    RayUnavailable,
    TlsConfig,
    node_id_bytes,
    resize_request,
    resolve_token,
)
from raysize.activities.ray_proto import ray_autoscaler_pb2 as pb
from raysize.activities.ray_proto import ray_rpc_pb2 as rpc
from raysize.activities.ray_state import (
    LabelOperator,
    NodeStatus,
    parse_cluster_state,
)
from raysize.sandbox.ports import free_port
from raysize.workflows.model import GangStrategy
from raysize.workflows.resources import Resources

NODE = bytes(range(28))


def reply(**state) -> pb.GetClusterResourceStateReply:
    return pb.GetClusterResourceStateReply(cluster_resource_state=pb.ClusterResourceState(**state))


def selector(key: str, *values: str, op=rpc.LABEL_OPERATOR_IN) -> rpc.LabelSelector:
    return rpc.LabelSelector(
        label_constraints=[
            rpc.LabelSelectorConstraint(label_key=key, operator=op, label_values=values)
        ]
    )


def test_nodes_carry_pod_group_status_and_exact_amounts() -> None:
    state = parse_cluster_state(
        reply(
            cluster_resource_state_version=7,
            node_states=[
                pb.NodeState(
                    node_id=NODE,
                    instance_id="raycluster-cpu-group-abcde",
                    ray_node_type_name="cpu-group",
                    node_ip_address="10.0.0.5",
                    status=pb.IDLE,
                    idle_duration_ms=4500,
                    total_resources={"CPU": 2.5, "memory": 4294967296.0, "GPU": 1.0},
                    available_resources={"CPU": 0.1, "memory": 1e9},
                    labels={"ray.io/node-group": "cpu-group"},
                ),
                pb.NodeState(node_id=bytes(28), instance_id="gone", status=pb.DEAD),
            ],
        )
    )
    node, dead = state.nodes
    assert node.node_id == NODE.hex()
    assert (node.pod, node.group, node.ip) == (
        "raycluster-cpu-group-abcde",
        "cpu-group",
        "10.0.0.5",
    )
    assert node.status is NodeStatus.IDLE and node.alive and node.idle_ms == 4500
    assert node.total == Resources.of(cpu=2500, memory=4 * 1024**3, GPU=10_000)
    assert node.available == Resources.of(cpu=100, memory=10**9)
    assert node.labels == {"ray.io/node-group": "cpu-group"}
    assert not dead.alive and dead.total == Resources()
    assert state.version == 7
    assert state.alive_nodes == (node,)


def test_node_for_pod_prefers_the_live_raylet_of_a_restarted_pod() -> None:
    state = parse_cluster_state(
        reply(
            node_states=[
                pb.NodeState(node_id=bytes(28), instance_id="pod-a", status=pb.DEAD),
                pb.NodeState(node_id=NODE, instance_id="pod-a", status=pb.RUNNING),
            ]
        )
    )
    found = state.node_for_pod("pod-a")
    assert found is not None and found.node_id == NODE.hex()
    assert state.node_for_pod("pod-b") is None


def test_demands_keep_counts_and_label_selectors() -> None:
    state = parse_cluster_state(
        reply(
            pending_resource_requests=[
                pb.ResourceRequestByCount(
                    request=pb.ResourceRequest(
                        resources_bundle={"CPU": 2}, label_selectors=[rpc.LabelSelector()]
                    ),
                    count=3,
                ),
                pb.ResourceRequestByCount(
                    request=pb.ResourceRequest(
                        resources_bundle={"CPU": 0.5, "memory": 3e9},
                        label_selectors=[
                            selector("group", "cpu"),
                            selector("zone", "a", "b", op=rpc.LABEL_OPERATOR_NOT_IN),
                        ],
                    ),
                    count=5,
                ),
            ]
        )
    )
    plain, selected = state.demands
    assert (plain.shape, plain.count, plain.label_selectors) == (Resources.of(cpu=2000), 3, ())
    assert selected.shape == Resources.of(cpu=500, memory=3 * 10**9)
    assert selected.count == 5
    first, second = selected.label_selectors
    assert first.constraints[0].key == "group" and first.constraints[0].values == ("cpu",)
    assert second.constraints[0].operator is LabelOperator.NOT_IN
    assert second.describe() == "zone !in (a,b)"


def test_gangs_read_strategy_state_and_bundles_from_bundle_selectors() -> None:
    spread = pb.ResourceRequest(
        resources_bundle={"CPU": 1},
        placement_constraints=[
            pb.PlacementConstraint(anti_affinity=pb.AntiAffinityConstraint(label_name="_PG_ab"))
        ],
    )
    state = parse_cluster_state(
        reply(
            pending_gang_resource_requests=[
                pb.GangResourceRequest(
                    requests=[pb.ResourceRequest(resources_bundle={"CPU": 9})],
                    details="c5f001000000:STRICT_SPREAD|RESCHEDULING",
                    bundle_selectors=[pb.BundleSelector(resource_requests=[spread, spread])],
                ),
                pb.GangResourceRequest(
                    requests=[pb.ResourceRequest(resources_bundle={"CPU": 3})],
                    details="d00d:PACK|PENDING",
                ),
            ]
        )
    )
    strict, legacy = state.gangs
    assert strict.placement_group_id == "c5f001000000"
    assert (strict.strategy, strict.state) == (GangStrategy.STRICT_SPREAD, "RESCHEDULING")
    assert [b.shape for b in strict.bundles] == [Resources.of(cpu=1000)] * 2
    constraint = strict.bundles[0].placement_constraints[0]
    assert (constraint.affinity, constraint.label) == (False, "_PG_ab")
    # Without bundle_selectors (older Ray), the legacy `requests` are the bundles.
    assert [b.shape for b in legacy.bundles] == [Resources.of(cpu=3000)]


def test_an_empty_constraint_entry_means_no_constraint() -> None:
    state = parse_cluster_state(
        reply(
            cluster_resource_constraints=[
                pb.ClusterResourceConstraint(),
                pb.ClusterResourceConstraint(
                    resource_requests=[
                        pb.ResourceRequestByCount(
                            request=pb.ResourceRequest(resources_bundle={"CPU": 1}), count=6
                        )
                    ]
                ),
            ]
        )
    )
    assert [(c.shape, c.count) for c in state.constraints] == [(Resources.of(cpu=1000), 6)]
    assert (
        parse_cluster_state(
            reply(cluster_resource_constraints=[pb.ClusterResourceConstraint()])
        ).constraints
        == ()
    )


def test_a_negative_free_amount_is_kept_not_rejected() -> None:
    state = parse_cluster_state(
        reply(node_states=[pb.NodeState(node_id=NODE, available_resources={"CPU": -0.5})])
    )
    assert state.nodes[0].available == Resources.of(cpu=-500)


@pytest.mark.parametrize(
    "bad",
    [
        reply(pending_gang_resource_requests=[pb.GangResourceRequest(details="garbage")]),
        reply(
            pending_gang_resource_requests=[pb.GangResourceRequest(details="ab:BEST_FIT|PENDING")]
        ),
        reply(node_states=[pb.NodeState(node_id=NODE, total_resources={"CPU": math.nan})]),
        reply(
            pending_resource_requests=[
                pb.ResourceRequestByCount(
                    request=pb.ResourceRequest(
                        label_selectors=[selector("k", "v", op=rpc.LABEL_OPERATOR_UNSPECIFIED)]
                    )
                )
            ]
        ),
    ],
    ids=["details", "strategy", "nan", "operator"],
)
def test_an_unreadable_reply_is_a_protocol_error(bad) -> None:
    with pytest.raises(RayReplyError):
        parse_cluster_state(bad)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ({"CPU": 0, "memory": 1e9}, "CPU: 0 must be > 0"),
        ({"CPU": -1, "memory": 1e9}, "CPU: -1 must be > 0"),
        ({"CPU": math.nan, "memory": 1e9}, "not a finite number"),
        ({"CPU": 1, "memory": math.inf}, "not a finite number"),
        ({"CPU": 1, "memory": 0}, "memory: 0 must be > 0"),
        ({"CPU": 1, "memory": 1.5}, "whole number of bytes"),
        ({"CPU": True, "memory": 1e9}, "not a number"),
        ({"CPU": 1, "memory": 1e9, "GPU": 1}, "only CPU and memory can be resized, not GPU"),
        ({"CPU": 1}, "memory is missing"),
    ],
)
def test_bad_resize_targets_are_refused(target, message) -> None:
    with pytest.raises(RayInvalidArgument, match=message):
        resize_request(target)


def test_a_resize_target_from_exact_resources() -> None:
    assert resize_request(Resources.of(cpu=1500, memory=2 * 1024**3)) == {
        "CPU": 1.5,
        "memory": 2147483648.0,
    }


@pytest.mark.parametrize(
    ("node_id", "message"),
    [("zz" * 28, "not hexadecimal"), ("ab" * 27, "got 27 bytes"), (b"", "got 0 bytes")],
)
def test_bad_node_ids_are_refused(node_id, message) -> None:
    with pytest.raises(RayInvalidArgument, match=message):
        node_id_bytes(node_id)


def test_bad_input_is_refused_before_anything_is_sent() -> None:
    # Nothing listens on this port: a request that went out would fail as unavailable.
    with RayGcsClient(f"127.0.0.1:{free_port()}", timeout=2) as client:
        with pytest.raises(RayInvalidArgument, match="GPU"):
            client.resize_raylet_resources(NODE.hex(), {"CPU": 1, "memory": 1e9, "GPU": 1})
        with pytest.raises(RayInvalidArgument, match="must be > 0"):
            client.resize_raylet(NODE.hex(), 0, 1e9)
        with pytest.raises(RayUnavailable, match="cannot reach"):
            client.resize_raylet(NODE.hex(), 1, 1e9)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ({"CPU": 0, "memory": 1e9}, "must be > 0"),
        ({"CPU": -1, "memory": 1e9}, "must be > 0"),
        ({"CPU": math.nan, "memory": 1e9}, "not a finite number"),
        ({"CPU": 1, "memory": 1e9, "GPU": 1}, "not GPU"),
    ],
    ids=["zero", "negative", "nan", "gpu"],
)
def test_a_refused_resize_never_reaches_the_gcs(target, message) -> None:
    """Ray would delete a resource set to 0 or less and accept NaN (docs/design/ray-protocol.md
    §3(c)), so these must not go out at all: the stand-in counts the resizes it gets."""
    from raysize.sandbox.gcs_standin import GcsStandIn

    with GcsStandIn() as gcs, RayGcsClient(gcs.address, timeout=5) as client:
        with pytest.raises(RayInvalidArgument, match=message):
            client.resize_raylet_resources(NODE.hex(), target)
        assert gcs.resizes == 0
        client.resize_raylet(NODE.hex(), 1, 1e9)  # the count counts
        assert gcs.resizes == 1


def test_token_comes_from_argument_then_env_then_file(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    env = {"RAY_AUTH_TOKEN": "from-env", "RAY_AUTH_TOKEN_PATH": str(token_file)}
    assert resolve_token("from-arg", env) == "from-arg"
    assert resolve_token(None, env) == "from-env"
    assert resolve_token(None, {"RAY_AUTH_TOKEN_PATH": str(token_file)}) == "from-file"
    assert resolve_token(None, {}) is None
    with pytest.raises(RayUnauthenticated, match="cannot read the token file"):
        resolve_token(None, {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")})


def test_tls_settings_follow_rays_environment(tmp_path: Path) -> None:
    assert TlsConfig.from_env({}) is None
    env = {
        "RAY_USE_TLS": "1",
        "RAY_TLS_CA_CERT": "ca.crt",
        "RAY_TLS_SERVER_CERT": "tls.crt",
        "RAY_TLS_SERVER_KEY": "tls.key",
    }
    assert TlsConfig.from_env(env) == TlsConfig(Path("ca.crt"), Path("tls.crt"), Path("tls.key"))
    with pytest.raises(RayInvalidArgument, match="RAY_TLS_SERVER_KEY"):
        TlsConfig.from_env({k: v for k, v in env.items() if k != "RAY_TLS_SERVER_KEY"})
    with pytest.raises(RayInvalidArgument, match="cannot read a TLS file"):
        RayGcsClient("127.0.0.1:1", tls=TlsConfig(tmp_path / "a", tmp_path / "b", tmp_path / "c"))


def test_the_client_reconnects_soon_after_an_outage_of_the_gcs() -> None:
    """gRPC backs off reconnecting up to 120 s by default and fails every call fast
    meanwhile; after a 20 s outage the client must reach the GCS again within a few
    seconds of its return (here: a stand-in GCS behind a proxy that the test cuts)."""
    from raysize.sandbox.gcs_standin import GcsStandIn
    from tests.e2e.gcs_proxy import GcsProxy

    with GcsStandIn() as gcs, GcsProxy(gcs.address) as proxy:
        client = RayGcsClient(proxy.address, timeout=2)
        try:
            client.cluster_state()
            proxy.go_dark()
            end = time.monotonic() + 20
            while time.monotonic() < end:  # an outage of 20 s, with calls failing all along
                with pytest.raises(RayUnavailable):
                    client.cluster_state()
                time.sleep(0.5)
            proxy.restore()
            back = time.monotonic() + 4  # the capped backoff is 2 s, plus jitter
            while True:
                try:
                    client.cluster_state()
                    break
                except RayUnavailable:
                    assert time.monotonic() < back, "still unreachable 4 s after the GCS came back"
                    time.sleep(0.1)
        finally:
            client.close()
