"""A Ray cluster without Ray processes: one GCS stand-in that reports a node per pod.

For benchmarks that need many clusters (`bench/fleet_bench.py`): a real Ray cluster
costs ~1 GB and several seconds per node, a hundred of them are out of reach. This one
answers the three RPCs raysize uses, over real gRPC, from a small model:

- a node per pod that `add_node` registered (its `instance_id` is the pod name, as
  KubeRay sets it), RUNNING while it holds work, IDLE (with its idle time) otherwise;
- pending demands (`add_demands`): a task shape waits until some node has room for it,
  then it runs there for good (the node's `available` shrinks);
- `ResizeRayletResourceInstances` sets the node's totals, as a Raylet does, and the
  waiting demands that now fit are placed.

The state version grows with every change, so raysize's wait sees the change.

`StandInFleet` serves a thousand of them from one process: a `grpc.server` per stand-in
is a thread per stand-in polling its completion queue (1,000 of them took 9 % of a core
doing nothing); the fleet's `grpc.aio` servers share one event loop and one poller."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from raysize.activities.ray_proto import ray_autoscaler_pb2 as autoscaler_pb2
from raysize.activities.ray_proto import ray_rpc_pb2 as rpc_pb2
from raysize.sandbox.grpc_services import Abort, add_service


@dataclass
class _Node:
    node_id: bytes
    pod: str
    group: str
    total: dict[str, float]
    used: dict[str, float] = field(default_factory=dict)
    idle_since: float = field(default_factory=time.monotonic)

    def fits(self, shape: dict[str, float]) -> bool:
        return all(self.total.get(k, 0.0) - self.used.get(k, 0.0) >= v for k, v in shape.items())

    def take(self, shape: dict[str, float]) -> None:
        for k, v in shape.items():
            self.used[k] = self.used.get(k, 0.0) + v


class _Model:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version = 1
        self.nodes: dict[str, _Node] = {}  # by pod name
        self.waiting: list[dict[str, float]] = []  # one entry per task
        self.placed = 0  # tasks that found room
        self.resizes = 0
        self.drains = 0  # DrainNode calls
        self.state_reads = 0

    def place(self) -> None:
        """Put every waiting task that fits somewhere (callers hold the lock)."""
        still: list[dict[str, float]] = []
        for shape in self.waiting:
            node = next((n for n in self.nodes.values() if n.fits(shape)), None)
            if node is None:
                still.append(shape)
                continue
            node.take(shape)
            self.placed += 1
        if len(still) != len(self.waiting):
            self.version += 1
        self.waiting = still


class _Autoscaler:
    def __init__(self, model: _Model) -> None:
        self.model = model

    def GetClusterResourceState(self, request: Any, context: Any) -> Any:
        m = self.model
        now = time.monotonic()
        with m.lock:
            m.state_reads += 1
            nodes = []
            for n in m.nodes.values():
                busy = any(v > 0 for v in n.used.values())
                available = {k: v - n.used.get(k, 0.0) for k, v in n.total.items()}
                nodes.append(
                    autoscaler_pb2.NodeState(
                        node_id=n.node_id,
                        instance_id=n.pod,
                        ray_node_type_name=n.group,
                        node_ip_address="127.0.0.1",
                        total_resources=n.total,
                        available_resources=available,
                        status=autoscaler_pb2.RUNNING if busy else autoscaler_pb2.IDLE,
                        idle_duration_ms=0 if busy else int((now - n.idle_since) * 1000),
                    )
                )
            counts: dict[tuple[tuple[str, float], ...], int] = {}
            for shape in m.waiting:
                key = tuple(sorted(shape.items()))
                counts[key] = counts.get(key, 0) + 1
            demands = [
                autoscaler_pb2.ResourceRequestByCount(
                    request=autoscaler_pb2.ResourceRequest(resources_bundle=dict(key)),
                    count=count,
                )
                for key, count in counts.items()
            ]
            version = m.version
        return autoscaler_pb2.GetClusterResourceStateReply(
            cluster_resource_state=autoscaler_pb2.ClusterResourceState(
                cluster_resource_state_version=version,
                cluster_session_name="standin",
                node_states=nodes,
                pending_resource_requests=demands,
            )
        )

    def ResizeRayletResourceInstances(self, request: Any, context: Any) -> Any:
        m = self.model
        with m.lock:
            node = next((n for n in m.nodes.values() if n.node_id == request.node_id), None)
            if node is None:
                raise Abort(grpc.StatusCode.NOT_FOUND, "Raylet not found")
            node.total.update(dict(request.resources))
            m.resizes += 1
            m.version += 1
            m.place()
            reply = dict(node.total)
        return autoscaler_pb2.ResizeRayletResourceInstancesReply(total_resources=reply)

    def DrainNode(self, request: Any, context: Any) -> Any:
        """As Ray 2.60 answers an idle-termination drain (docs/design/ray-protocol.md §7): a busy
        node refuses in Ray's words; an idle one is accepted and its Raylet ends (Ray
        reports it dead); an unknown one is accepted."""
        m = self.model
        with m.lock:
            m.drains += 1
            node = next((n for n in m.nodes.values() if n.node_id == request.node_id), None)
            if node is not None and any(v > 0 for v in node.used.values()):
                return autoscaler_pb2.DrainNodeReply(
                    is_accepted=False,
                    rejection_reason_message="The node to be idle terminated is no longer idle.",
                )
            if node is not None:
                del m.nodes[node.pod]
                m.version += 1
        return autoscaler_pb2.DrainNodeReply(is_accepted=True)


class _NodeInfo:
    def GetAllNodeInfo(self, request: Any, context: Any) -> Any:
        return rpc_pb2.GetAllNodeInfoReply()


class _InternalKV:
    """The cluster metadata a Ray head records at start (the Ray and Python versions);
    any other key is not there, as Ray answers it (GcsStatus NotFound, code 17)."""

    def __init__(self, ray_version: str) -> None:
        self.metadata = json.dumps({"ray_version": ray_version, "python_version": "3.11.0"})

    def InternalKVGet(self, request: Any, context: Any) -> Any:
        if (request.namespace, request.key) == (b"cluster", b"CLUSTER_METADATA"):
            return rpc_pb2.InternalKVGetReply(value=self.metadata.encode())
        missing = rpc_pb2.GcsStatus(code=17, message="Failed to find the key")
        return rpc_pb2.InternalKVGetReply(status=missing)


class RayStandIn:
    """`with RayStandIn() as ray: ray.add_node(...)`; its server stops on exit, always."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        threads: int = 2,
        ray_version: str = "2.60.0",
        *,
        serve: bool = True,
    ) -> None:
        """`serve=False`: no server of its own (`StandInFleet` serves it); `port` is 0."""
        self.model = _Model()
        self.services: list[tuple[Any, str, object]] = [
            (autoscaler_pb2, "AutoscalerStateService", _Autoscaler(self.model)),
            (rpc_pb2, "NodeInfoGcsService", _NodeInfo()),
            (rpc_pb2, "InternalKVGcsService", _InternalKV(ray_version)),
        ]
        self._server: grpc.Server | None = None
        self.port = 0
        if serve:
            self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads))
            for pb2, name, impl in self.services:
                add_service(self._server, pb2, name, impl)
            self.port = self._server.add_insecure_port(f"{host}:0")
        self.address = f"{host}:{self.port}"
        self._next_id = 1

    def listen(self, host: str = "127.0.0.1") -> int:
        """One more port this stand-in answers on (call before `__enter__`): one server
        stands in for the GCS of many clusters, each at an address of its own."""
        if self._server is None:
            raise ValueError("listen: this stand-in has no server (serve=False)")
        return int(self._server.add_insecure_port(f"{host}:0"))

    def add_node(self, pod: str, group: str, cpu: float, memory: float) -> bool:
        """A Raylet registers for `pod` (False: it already had one)."""
        m = self.model
        with m.lock:
            if pod in m.nodes:
                return False
            node_id = self._next_id.to_bytes(28, "big")
            self._next_id += 1
            m.nodes[pod] = _Node(node_id, pod, group, {"CPU": cpu, "memory": memory})
            m.version += 1
            m.place()
            return True

    def remove_node(self, pod: str) -> None:
        with self.model.lock:
            if self.model.nodes.pop(pod, None) is not None:
                self.model.version += 1

    def add_demands(self, shape: dict[str, float], count: int) -> None:
        with self.model.lock:
            self.model.waiting.extend(dict(shape) for _ in range(count))
            self.model.version += 1
            self.model.place()

    def counts(self) -> tuple[int, int, int, int]:
        """(tasks placed, tasks waiting, Raylet resizes, state reads)."""
        m = self.model
        with m.lock:
            return m.placed, len(m.waiting), m.resizes, m.state_reads

    def totals(self, pod: str) -> dict[str, float]:
        with self.model.lock:
            node = self.model.nodes.get(pod)
            return dict(node.total) if node else {}

    def __enter__(self) -> RayStandIn:
        if self._server is not None:
            self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.stop(grace=None)


class StandInFleet:
    """`count` RayStandIns, each at its own port, served by `grpc.aio` servers on one
    event loop in a thread of its own:

        with StandInFleet(1000) as fleet:
            fleet.stand_ins[0].port, fleet.stand_ins[0].add_node(...)

    The methods run on the loop (each holds its model's lock a moment); everything it
    started stops on exit, always."""

    def __init__(self, count: int, host: str = "127.0.0.1") -> None:
        if count < 1:
            raise ValueError(f"count: {count}: expected at least 1")
        self.host = host
        self.stand_ins = [RayStandIn(host, serve=False) for _ in range(count)]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="standins")
        self._servers: list[grpc.aio.Server] = []

    async def _start(self) -> None:
        for ray in self.stand_ins:
            server = grpc.aio.server()
            self._servers.append(server)
            for pb2, name, impl in ray.services:
                add_service(server, pb2, name, impl, asynchronous=True)
            ray.port = server.add_insecure_port(f"{self.host}:0")
            ray.address = f"{self.host}:{ray.port}"
            await server.start()

    async def _stop(self) -> None:
        await asyncio.gather(*(s.stop(grace=None) for s in self._servers))

    def __enter__(self) -> StandInFleet:
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(120)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(60)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(10)
        if not self._loop.is_running():
            self._loop.close()
