"""A Ray GCS stand-in for throughput benchmarks only.

A thousand real Raylets do not fit on two cores, so the orchestration benchmark talks to
this small gRPC server instead: it speaks the RPCs raysize uses, from the same
`.proto` files (`activities/ray_proto`), and keeps each node's totals in memory. Every
correctness test uses a real Ray.
"""

from __future__ import annotations

import threading
from concurrent import futures
from typing import Any

import grpc

from raysize.activities.ray_proto import ray_autoscaler_pb2 as autoscaler_pb2
from raysize.activities.ray_proto import ray_autoscaler_pb2_grpc as autoscaler_grpc
from raysize.activities.ray_proto import ray_rpc_pb2 as rpc_pb2
from raysize.activities.ray_proto import ray_rpc_pb2_grpc as rpc_grpc


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version = 1
        self.totals: dict[bytes, dict[str, float]] = {}
        self.resizes = 0
        self.state_reads = 0  # GetClusterResourceState calls answered


class _Autoscaler(autoscaler_grpc.AutoscalerStateServiceServicer):
    def __init__(self, state: _State) -> None:
        self.state = state

    def GetClusterResourceState(self, request: Any, context: Any) -> Any:
        with self.state.lock:
            version = self.state.version
            self.state.state_reads += 1
        return autoscaler_pb2.GetClusterResourceStateReply(
            cluster_resource_state=autoscaler_pb2.ClusterResourceState(
                cluster_resource_state_version=version, cluster_session_name="standin"
            )
        )

    def ResizeRayletResourceInstances(self, request: Any, context: Any) -> Any:
        with self.state.lock:
            totals = self.state.totals.setdefault(request.node_id, {})
            totals.update(dict(request.resources))
            self.state.version += 1
            self.state.resizes += 1
            reply = dict(totals)
        return autoscaler_pb2.ResizeRayletResourceInstancesReply(total_resources=reply)

    def DrainNode(self, request: Any, context: Any) -> Any:
        # no node here runs work: every drain is accepted, as Ray accepts an idle node's
        return autoscaler_pb2.DrainNodeReply(is_accepted=True)


class _NodeInfo(rpc_grpc.NodeInfoGcsServiceServicer):
    def GetAllNodeInfo(self, request: Any, context: Any) -> Any:
        return rpc_pb2.GetAllNodeInfoReply()


class GcsStandIn:
    """`with GcsStandIn() as gcs: ... gcs.address ...`; stopped on exit, always."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.state = _State()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        autoscaler_grpc.add_AutoscalerStateServiceServicer_to_server(
            _Autoscaler(self.state), self._server
        )
        rpc_grpc.add_NodeInfoGcsServiceServicer_to_server(_NodeInfo(), self._server)
        self.port = self._server.add_insecure_port(f"{host}:0")
        self.address = f"{host}:{self.port}"

    @property
    def resizes(self) -> int:
        with self.state.lock:
            return self.state.resizes

    @property
    def state_reads(self) -> int:
        with self.state.lock:
            return self.state.state_reads

    def totals(self, node_id: bytes) -> dict[str, float]:
        with self.state.lock:
            return dict(self.state.totals.get(node_id, {}))

    def __enter__(self) -> GcsStandIn:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None).wait(5)
