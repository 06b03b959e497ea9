"""The checked-in protos: reproducible stubs, and faithful to the installed Ray's descriptors."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from raysize.activities.ray_gcs import RayGcsClient
from raysize.activities.ray_proto import ray_autoscaler_pb2, ray_rpc_pb2
from tests.ray.descriptors import compare

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "activities" / "ray_proto"


def ours() -> list[descriptor_pb2.FileDescriptorProto]:
    files = []
    for module in (ray_rpc_pb2, ray_autoscaler_pb2):
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        files.append(proto)
    return files


@pytest.fixture(scope="module")
def ray_files() -> list[descriptor_pb2.FileDescriptorProto]:
    # Ray's generated modules are imported in a child process only: the full names they
    # register are the same as ours, and one descriptor pool cannot hold both.
    out = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("ray_descriptors.py"))],
        check=True,
        capture_output=True,
        cwd=ROOT,
        timeout=120,
    )
    return [
        descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(blob))
        for blob in json.loads(out.stdout)
    ]


def test_regenerating_the_stubs_gives_the_checked_in_files(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_ray_proto.py"), "--out", str(tmp_path)],
        check=True,
        timeout=120,
    )
    generated = sorted(
        p.name for p in (tmp_path / "raysize" / "activities" / "ray_proto").iterdir()
    )
    checked_in = sorted(p.name for p in PROTO_DIR.glob("*_pb2*"))
    assert generated == checked_in
    for name in generated:
        fresh = (tmp_path / "raysize" / "activities" / "ray_proto" / name).read_bytes()
        assert fresh == (PROTO_DIR / name).read_bytes(), (
            f"{name} is stale: run scripts/gen_ray_proto.py"
        )


def test_our_descriptors_match_the_installed_ray(ray_files) -> None:
    assert compare(ours(), ray_files) == []


def test_the_protos_define_exactly_the_rpcs_the_client_calls() -> None:
    defined = {
        f"/{f.package}.{s.name}/{m.name}" for f in ours() for s in f.service for m in s.method
    }
    with RayGcsClient("127.0.0.1:1") as client:  # builds its calls; sends nothing
        called = {
            path
            for path, _ in (
                client._get_cluster_resource_state,
                client._resize_raylet_resource_instances,
                client._drain_node,
                client._get_all_node_info,
                client._internal_kv_get,
            )
        }
    assert (
        defined
        == called
        == {
            "/ray.rpc.autoscaler.AutoscalerStateService/GetClusterResourceState",
            "/ray.rpc.autoscaler.AutoscalerStateService/ResizeRayletResourceInstances",
            "/ray.rpc.autoscaler.AutoscalerStateService/DrainNode",
            "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",
            "/ray.rpc.InternalKVGcsService/InternalKVGet",
        }
    )


def _field(files, message: str, field: str):
    package, _, name = message.rpartition(".")
    for f in files:
        if f.package == package:
            for m in f.message_type:
                if m.name == name:
                    return next(x for x in m.field if x.name == field)
    raise LookupError(message)


def _map_value(files, message: str, entry: str):
    package, _, name = message.rpartition(".")
    m = next(m for f in files if f.package == package for m in f.message_type if m.name == name)
    return next(
        x for x in next(n for n in m.nested_type if n.name == entry).field if x.name == "value"
    )


def test_the_check_catches_a_wrong_number_a_wrong_width_and_a_wrong_map_value(ray_files) -> None:
    mutated = ours()
    _field(mutated, "ray.rpc.autoscaler.NodeState", "idle_duration_ms").number = 19
    _field(
        mutated, "ray.rpc.GcsNodeInfo", "node_manager_port"
    ).type = descriptor_pb2.FieldDescriptorProto.TYPE_INT64
    _map_value(
        mutated, "ray.rpc.autoscaler.ResizeRayletResourceInstancesRequest", "ResourcesEntry"
    ).type = descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT
    problems = compare(mutated, ray_files)
    assert any("idle_duration_ms (#19)" in p for p in problems)
    assert any("node_manager_port (#5): type" in p for p in problems)
    assert any("ResourcesEntry.value (#2): type" in p for p in problems)


def test_the_check_catches_a_missing_optional(ray_files) -> None:
    mutated = ours()
    _field(mutated, "ray.rpc.GetAllNodeInfoRequest", "state_filter").proto3_optional = False
    assert any("state_filter (#3): proto3_optional" in p for p in compare(mutated, ray_files))
