"""A Ray GCS stand-in for throughput benchmarks only.

A thousand real Raylets do not fit on two cores, so the orchestration benchmark talks to
this small gRPC server instead: it speaks the RPCs raysize uses, from the same
`.proto` files (`activities/ray_proto`), and keeps each node's totals in memory. Every
correctness test uses a real Ray.

With a `token`, it checks every call's token as Ray 2.60 in `RAY_AUTH_MODE=token` does
(docs/design/ray-protocol.md §3(d)): metadata `authorization: Bearer <token>`, anything else
refused with UNAUTHENTICATED and Ray's words. `token` may be changed while it runs (a Ray
restarted with a rotated token); `refused` counts the calls it turned away.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from typing import Any

import grpc

from raysize.activities.ray_proto import ray_autoscaler_pb2 as autoscaler_pb2
from raysize.activities.ray_proto import ray_rpc_pb2 as rpc_pb2
from raysize.sandbox.grpc_services import add_service

# what Ray 2.60 answers a call without the right token (docs/design/ray-protocol.md §3(d))
INVALID_TOKEN = "InvalidAuthToken: Authentication token is missing or incorrect"


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.token: str | None = None
        self.refused = 0
        # every `authorization` value a call carried (None: none): what a GCS run by a
        # tenant would capture
        self.presented: set[str | None] = set()
        self.version = 1
        self.totals: dict[bytes, dict[str, float]] = {}
        self.resizes = 0
        self.state_reads = 0  # GetClusterResourceState calls answered
        self.state_delay_s = 0.0  # how long each GetClusterResourceState takes


class _Autoscaler:
    def __init__(self, state: _State) -> None:
        self.state = state

    def GetClusterResourceState(self, request: Any, context: Any) -> Any:
        with self.state.lock:
            version = self.state.version
            self.state.state_reads += 1
            delay = self.state.state_delay_s
        if delay:
            time.sleep(delay)  # a loaded GCS (or a loaded reader): each answer this late
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


class _NodeInfo:
    def GetAllNodeInfo(self, request: Any, context: Any) -> Any:
        return rpc_pb2.GetAllNodeInfoReply()


class _TokenCheck(grpc.ServerInterceptor):  # type: ignore[misc]
    """Ray's token check: the exact `authorization: Bearer <token>`, before any handler."""

    def __init__(self, state: _State) -> None:
        self.state = state

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        sent = dict(handler_call_details.invocation_metadata or ()).get("authorization")
        with self.state.lock:
            token = self.state.token
            self.state.presented.add(sent)
        if token is None:
            return continuation(handler_call_details)
        if sent == f"Bearer {token}":
            return continuation(handler_call_details)
        with self.state.lock:
            self.state.refused += 1

        def refuse(request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, INVALID_TOKEN)

        return grpc.unary_unary_rpc_method_handler(refuse)


class GcsStandIn:
    """`with GcsStandIn() as gcs: ... gcs.address ...`; stopped on exit, always."""

    def __init__(self, host: str = "127.0.0.1", token: str | None = None) -> None:
        self.state = _State()
        self.state.token = token
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8), interceptors=[_TokenCheck(self.state)]
        )
        add_service(self._server, autoscaler_pb2, "AutoscalerStateService", _Autoscaler(self.state))
        add_service(self._server, rpc_pb2, "NodeInfoGcsService", _NodeInfo())
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

    @property
    def token(self) -> str | None:
        with self.state.lock:
            return self.state.token

    @token.setter
    def token(self, token: str | None) -> None:
        with self.state.lock:
            self.state.token = token

    @property
    def state_delay_s(self) -> float:
        """Seconds each read of the cluster state takes (0: at once)."""
        with self.state.lock:
            return self.state.state_delay_s

    @state_delay_s.setter
    def state_delay_s(self, seconds: float) -> None:
        with self.state.lock:
            self.state.state_delay_s = seconds

    @property
    def presented(self) -> set[str | None]:
        """Every `authorization` value the calls carried (None: a call without one)."""
        with self.state.lock:
            return set(self.state.presented)

    @property
    def refused(self) -> int:
        with self.state.lock:
            return self.state.refused

    def totals(self, node_id: bytes) -> dict[str, float]:
        with self.state.lock:
            return dict(self.state.totals.get(node_id, {}))

    def __enter__(self) -> GcsStandIn:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None).wait(5)
