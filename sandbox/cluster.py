"""The whole sandbox in one object: API server, kubelet, operator, optional Ray processes.

    with Sandbox(SandboxConfig(nodes=2)) as sb:
        sb.write_kubeconfig(path)        # kubectl / kubernetes client now talk to it
        sb.faults.add(FaultRule(verb="patch", resource="pods/resize", error_rate=0.2))

Everything it starts is stopped by `close()`, which `__exit__` always calls.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from raysize.sandbox.faults import Faults
from raysize.sandbox.kubeconfig import write_kubeconfig
from raysize.sandbox.kubelet import ExitReport, Kubelet, KubeletTiming, NodeSpec, PodRuntime
from raysize.sandbox.operator import RayOperator
from raysize.sandbox.rayprocs import RayRuntime
from raysize.sandbox.server import Api, ApiServer
from raysize.sandbox.store import HISTORY, Obj, Store
from raysize.workflows.resources import GIB


@dataclass
class SandboxConfig:
    nodes: int = 1
    node_cpu: int = 8000  # millicores per node
    node_memory: int = 32 * GIB  # bytes per node
    max_pods: int = 110  # per node, the kubelet's default
    with_ray: bool = False
    port: int = 0  # 0: any free port
    host: str = "127.0.0.1"
    timing: KubeletTiming = field(default_factory=KubeletTiming)
    fault_seed: int = 0
    node_specs: list[NodeSpec] | None = None  # overrides nodes/node_cpu/node_memory
    # the API server's Kubernetes minor: 35 (the kubelet reports Infeasible) or 36 (resize
    # admission refuses what the node cannot hold, as the real v1.36 does)
    kubernetes_minor: int = 35
    watch_history: int = HISTORY  # watch events kept; a watch from before them is 410 Gone
    # with_ray: run Ray processes only for the RayClusters of these names (None: all); the
    # others' pods run nothing, and a GCS stand-in may answer for them (`serve_gcs`)
    ray_clusters: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"nodes: {self.nodes}: expected at least 1")
        if self.node_cpu <= 0 or self.node_memory <= 0:
            raise ValueError("node capacity must be positive")
        if self.kubernetes_minor not in (35, 36):
            raise ValueError(f"kubernetes_minor: {self.kubernetes_minor}: expected 35 or 36")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: {self.port}: expected 0..65535")

    def node_list(self) -> list[NodeSpec]:
        if self.node_specs is not None:
            return list(self.node_specs)
        return [
            NodeSpec(f"sandbox-node-{i}", self.node_cpu, self.node_memory, max_pods=self.max_pods)
            for i in range(self.nodes)
        ]


class OnlyClusters:
    """A pod runtime for some RayClusters' pods only; the rest run nothing (a bench runs
    one cluster with real Ray among many that a GCS stand-in answers for)."""

    def __init__(self, inner: PodRuntime, clusters: frozenset[str]) -> None:
        self.inner, self.clusters = inner, clusters

    def _ours(self, pod: Obj) -> bool:
        return (pod["metadata"].get("labels") or {}).get("ray.io/cluster") in self.clusters

    def start(self, pod: Obj) -> str | None:
        return self.inner.start(pod) if self._ours(pod) else None

    def stop_all(self, pods: list[Obj]) -> None:
        ours = [p for p in pods if self._ours(p)]
        if ours:
            self.inner.stop_all(ours)

    def on_exit(self, report: ExitReport) -> None:
        self.inner.on_exit(report)

    def restart(self, pod: Obj, container: str) -> None:
        if self._ours(pod):
            self.inner.restart(pod, container)


class Sandbox:
    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self.store = Store(self.config.watch_history)
        self.faults = Faults(self.config.fault_seed)
        self.api = Api(self.store, self.faults, minor=self.config.kubernetes_minor)
        self.server = ApiServer(self.api, self.config.host, self.config.port)
        self.ray: RayRuntime | None = RayRuntime() if self.config.with_ray else None
        runtime: PodRuntime | None = self.ray
        if self.ray is not None and self.config.ray_clusters is not None:
            runtime = OnlyClusters(self.ray, frozenset(self.config.ray_clusters))
        # (namespace, RayCluster) → the port of a GCS stand-in that answers for it
        self._gcs_ports: dict[tuple[str, str], int] = {}
        self.kubelet = Kubelet(
            self.store,
            self.config.node_list(),
            self.config.timing,
            runtime=runtime,
            pod_ip=(lambda node, i: "127.0.0.1") if self.config.with_ray else None,
            schedules=True,  # no kube-scheduler here: the demo needs nothing installed
        )
        self.operator = RayOperator(
            self.api,
            gcs_port=self._gcs_port,
            service_ip=self._service_ip,
        )
        self._started = False

    @property
    def url(self) -> str:
        return self.server.url

    def serve_gcs(self, namespace: str, cluster: str, port: int) -> None:
        """A GCS stand-in on 127.0.0.1:`port` answers for this RayCluster: its status
        reports that address, as KubeRay reports the head's."""
        self._gcs_ports[(namespace, cluster)] = port

    def _service_ip(self, namespace: str, cluster: str) -> str | None:
        """The head Service's IP, where the GCS answers: this machine's for real Ray and
        for a cluster `serve_gcs` answers for; else one the operator makes up."""
        if self.config.with_ray or (namespace, cluster) in self._gcs_ports:
            return "127.0.0.1"
        return None

    def _gcs_port(self, namespace: str, cluster: str) -> int | None:
        port = self._gcs_ports.get((namespace, cluster))
        if port is None and self.ray is not None:
            port = self.ray.gcs_port(namespace, cluster)
        return port

    def start(self) -> Sandbox:
        try:
            self.kubelet.start()
            self.operator.start()
            self.server.start()
        except BaseException:
            self.close()
            raise
        self._started = True
        return self

    def close(self) -> None:
        """Stop everything this sandbox started; safe to call more than once."""
        try:
            self.server.stop()
        finally:
            try:
                self.operator.stop()
            finally:
                try:
                    self.kubelet.stop()
                finally:
                    if self.ray is not None:
                        self.ray.close()

    def write_kubeconfig(self, path: str | os.PathLike[str]) -> Path:
        return write_kubeconfig(path, self.url)

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
