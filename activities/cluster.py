"""Activities that join Kubernetes and Ray: observe a cluster, wait for it to change,
resize a Raylet, find clusters to manage and make sure each has its reconcile workflow.

Observing reads the RayCluster and its pods (Kubernetes) and the nodes, demands, gangs
and constraints (the Ray GCS), and joins them by pod name (Ray's `instance_id`). A read
that fails raises: the workflow treats it as "unknown", never as "nothing".
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.gcs_cadence import (
    MOST_UNCERTAIN_S,
    PERIOD_MIN_S,
    WIDEST_WINDOW_S,
    GcsCadence,
)
from activities.k8s import K8sActivities, Kube, KubeCluster
from activities.k8s_errors import ClusterGone, Forbidden, Invalid, KubeError, NotFound
from activities.pod_watch import PodWatch
from activities.ray_errors import RayError, RayletNotFound, RayUnauthenticated
from activities.ray_gcs import RayGcsClient, TlsConfig
from activities.ray_state import ClusterState, LabelOperator, LabelSelector, RayNode
from workflows.contracts import (
    RAY_STATE_READS,
    Act,
    Err,
    FinishResizeInput,
    FinishResizeResult,
    Observation,
    ObserveInput,
    RayletResizeInput,
    RayletResizeResult,
    ReconcileInput,
    WaitInput,
)
from workflows.model import (
    ClusterSnapshot,
    Constraint,
    Demand,
    Gang,
    KubeletResizeState,
    PlannerSettings,
    PodPhase,
    PodResize,
    PodView,
)
from workflows.naming import (
    RECONCILE_WORKFLOW,
    reconcile_search_attributes,
    reconcile_workflow_id,
)
from workflows.resources import CPU, MEMORY
from workflows.summaries import reconcile_details, reconcile_summary

log = logging.getLogger("raysize.activities")


def selector_text(selectors: tuple[LabelSelector, ...]) -> dict[str, str]:
    """Ray's label selector → the planner's syntax ("v", "!v", "in(a,b)", "!in(a,b)")."""
    if not selectors:
        return {}
    out: dict[str, str] = {}
    for c in selectors[0].constraints:
        neg = "!" if c.operator == LabelOperator.NOT_IN else ""
        body = c.values[0] if len(c.values) == 1 else f"in({','.join(c.values)})"
        out[c.key] = neg + body
    return out


def _newest_node(nodes: list[RayNode], recorded: str | None) -> RayNode | None:
    """The pod's Raylet. A restarted Raylet registers anew while Ray may still list the
    old one as alive (until its health checks fail): prefer the one the pod's
    ray.io/ippr-status does not name (that one was recorded before the restart)."""
    if len(nodes) > 1:
        fresh = [n for n in nodes if n.node_id != recorded]
        nodes = fresh or nodes
    return nodes[-1] if nodes else None


def join(kube: KubeCluster, ray: ClusterState, settings: PlannerSettings) -> ClusterSnapshot:
    """One snapshot from both sides. Pods whose Raylet has not registered are pending;
    replicas asked for but not yet created count as pending pods too, so a slow operator
    never makes the planner launch twice."""
    by_pod: dict[str, list[RayNode]] = {}
    for n in ray.nodes:
        if n.status.value != "DEAD":
            by_pod.setdefault(n.pod, []).append(n)
    deleting = set(kube.workers_to_delete)
    resizing = set(kube.resizing)
    pods: list[PodView] = []
    for view in kube.pods:
        if view.name in deleting:
            continue
        node = _newest_node(by_pod.get(view.name, []), view.raylet_id)
        if node is None:
            pods.append(view.model_copy(update={"phase": PodPhase.PENDING, "raylet_id": None}))
            continue
        update: dict[str, Any] = {
            "phase": PodPhase.RUNNING if view.phase == PodPhase.RUNNING else PodPhase.PENDING,
            "raylet_id": node.node_id,
            "total": node.total,
            "available": node.available,
            "idle_s": node.idle_ms / 1000.0,
            "labels": {**view.labels, **node.labels},
        }
        if view.resize is None and view.name in resizing:
            update["resize"] = PodResize(
                cpu=view.total.cpu, memory=view.total.memory, state=KubeletResizeState.IN_PROGRESS
            )
        elif view.resize is None and (
            node.total.get_units(CPU) != view.total.cpu
            or node.total.get_units(MEMORY) != view.total.memory
        ):
            # the pod has its new size and the Raylet not (yet): a resize is finishing, or
            # a restarted Raylet came back at its start-up size (KubeRay's `ray start`
            # line keeps the template's CPUs)
            update["resize"] = PodResize(
                cpu=view.total.cpu,
                memory=view.total.memory,
                state=KubeletResizeState.IN_PROGRESS,
                raylet_only=True,
            )
        pods.append(view.model_copy(update=update))
    have: dict[str, int] = {}
    for p in pods:
        have[p.group] = have.get(p.group, 0) + 1
    for group, wanted in sorted(kube.replicas.items()):
        spec = kube.groups.groups.get(group)
        for i in range(max(0, wanted - have.get(group, 0))):
            if spec is None:
                break
            pods.append(
                PodView(
                    name=f"{kube.name}-{group}-not-created-{i}",
                    group=group,
                    phase=PodPhase.PENDING,
                    total=spec.resources,
                    available=spec.resources,
                )
            )
    base = kube.snapshot(settings)
    return base.model_copy(
        update={
            "pods": tuple(pods),
            "demands": tuple(
                Demand(
                    shape=d.shape, count=d.count, label_selector=selector_text(d.label_selectors)
                )
                for d in ray.demands
            ),
            "gangs": tuple(
                Gang(
                    bundles=tuple(b.shape for b in g.bundles),
                    strategy=g.strategy,
                    bundle_selectors=tuple(selector_text(b.label_selectors) for b in g.bundles),
                )
                for g in ray.gangs
            ),
            "constraints": tuple(Constraint(shape=c.shape, count=c.count) for c in ray.constraints),
        }
    )


def list_rayclusters(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    """Every RayCluster in a namespace ("" for all namespaces)."""
    return kube.list_rayclusters(namespace)


# How often the wait reads Ray's state (the GCS has no watch). Right after an observe,
# when a change is most likely to follow (a Raylet resized, a node registering), every
# 0.1 s. Once the cluster has been quiet for RAY_FAST_WINDOW_S: once a second, just after
# the GCS publishes the Raylets' demands, when that timetable is known (gcs_cadence);
# every 0.55 s while it is not. Some fast reads land inside the doubt about a publication
# and one just after it: that is how the timetable is learned. Never more than a tenth of
# the time on the GCS: the state of a thousand nodes takes ~50 ms to build.
RAY_FAST_PAUSE_S = 0.1
RAY_FAST_WINDOW_S = 5.0
RAY_IDLE_PAUSE_S = 0.55
AFTER_PUBLICATION_S = 0.015  # the GCS takes the Raylets' answers in a few ms
PIN_STEP_S = 0.01  # fast reads: no closer than this inside the doubt
HEARTBEAT_EVERY_S = 4.0  # the wait's heartbeat timeout is 10 s; the SDK sends at most every 8 s


def ray_read_pause(
    quiet_s: float,
    read_s: float,
    now: float = 0.0,
    publication: tuple[float, float] | None = None,
) -> float:
    """Seconds to the next read of Ray's state, `quiet_s` into a wait whose last read
    took `read_s`; `publication`: the next demand publication's (earliest, latest)
    instant on the clock of `now`, when known (`GcsCadence.next_publication`)."""
    floor = 9 * read_s
    fast = quiet_s < RAY_FAST_WINDOW_S
    if publication is None:
        return max(RAY_FAST_PAUSE_S if fast else RAY_IDLE_PAUSE_S, floor)
    earliest, latest = publication
    pause = latest + AFTER_PUBLICATION_S - now
    if fast:
        # reading often anyway: a few reads inside the doubt about the instant as well,
        # so that a change is pinned between two of them and the timetable sharpens
        step = max(PIN_STEP_S, (latest - earliest) / 10)
        inside = earliest + step * max(0, math.floor((now - earliest) / step + 1))
        if inside < latest:
            pause = min(pause, inside - now)
        return max(min(pause, RAY_FAST_PAUSE_S), floor)
    while pause < floor:  # a slow GCS: skip publications rather than load it
        pause += PERIOD_MIN_S
    return pause


def next_read_pause(quiet_s: float, read_s: float, now: float, cadence: GcsCadence) -> float:
    """`ray_read_pause` with what `cadence` knows of the next publication: fast reads pin
    it while the doubt is up to WIDEST_WINDOW_S; quiet reads wait for it only when it is
    known to MOST_UNCERTAIN_S."""
    doubt = WIDEST_WINDOW_S if quiet_s < RAY_FAST_WINDOW_S else MOST_UNCERTAIN_S
    return ray_read_pause(quiet_s, read_s, now, cadence.next_publication(now, doubt))


def _count_state_reads(namespace: str, cluster: str, n: int) -> None:
    """`raysize_ray_state_reads`: what raysize costs each GCS (read by bench.idle_bench)."""
    if n:
        activity.metric_meter().create_counter(
            RAY_STATE_READS, "GetClusterResourceState calls to the cluster's GCS"
        ).add(n, {"cluster": cluster, "k8s_namespace": namespace})


async def start_reconciler(
    client: Client, inp: ReconcileInput, task_queue: str
) -> WorkflowHandle[Any, str]:
    """Start the reconcile workflow of a RayCluster, with its search attributes; one that
    is already running is kept (and returned)."""
    # by its type name: activities never import a workflow module
    return await client.start_workflow(
        RECONCILE_WORKFLOW,
        inp,
        result_type=str,
        id=reconcile_workflow_id(inp.namespace, inp.cluster),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        search_attributes=reconcile_search_attributes(inp.namespace, inp.cluster),
        static_summary=reconcile_summary(inp.namespace, inp.cluster),
        static_details=reconcile_details(inp.namespace, inp.cluster),
    )


def _pod_gone(inp: RayletResizeInput, why: str) -> ApplicationError:
    return ApplicationError(
        f"{inp.namespace}/{inp.pod}: {why}", type=Err.POD_GONE, non_retryable=True
    )


def _ray_error(exc: RayError) -> ApplicationError:
    if isinstance(exc, RayletNotFound):
        kind = Err.RAYLET_GONE
    elif isinstance(exc, RayUnauthenticated):
        kind = Err.RAY_AUTH
    else:
        kind = type(exc).__name__
    return ApplicationError(str(exc), type=kind, non_retryable=not exc.retryable)


@dataclass
class RaySettings:
    """How to reach each cluster's GCS."""

    gcs_override: str | None = None  # one address for every cluster (tests, port-forward)
    token: str | None = None
    tls: TlsConfig | None = None
    timeout_s: float = 10.0


@dataclass
class ClusterActivities:
    """Activities joining Kubernetes and Ray. One instance per worker process."""

    kube: Kube
    ray: RaySettings = field(default_factory=RaySettings)
    settings: PlannerSettings = field(default_factory=PlannerSettings)
    _clients: dict[str, RayGcsClient] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _addresses: dict[tuple[str, str], str] = field(default_factory=dict)
    pods: PodWatch | None = None  # set in __post_init__: one pod watch per worker

    def __post_init__(self) -> None:
        if self.pods is None:
            self.pods = PodWatch(self.kube.core, self.kube.custom)

    def activities(self) -> list[Callable[..., Any]]:
        return [
            self.observe_cluster,
            self.wait_for_change,
            self.resize_raylet,
            self.finish_resize,
            *K8sActivities(self.kube, self.pods).activities(),
        ]

    # --- helpers --------------------------------------------------------------------
    def gcs(self, address: str) -> RayGcsClient:
        with self._lock:
            client = self._clients.get(address)
            if client is None:
                client = RayGcsClient(
                    address, token=self.ray.token, tls=self.ray.tls, timeout=self.ray.timeout_s
                )
                self._clients[address] = client
            return client

    def close(self) -> None:
        if self.pods is not None:
            self.pods.close()
        with self._lock:
            for c in self._clients.values():
                c.close()
            self._clients.clear()

    def _address(self, kube: KubeCluster, override: str | None) -> str:
        address = override or self.ray.gcs_override or kube.gcs_address
        if not address:
            address = f"{kube.name}-head-svc.{kube.namespace}.svc:6379"
        self._addresses[(kube.namespace, kube.name)] = address
        return address

    async def _address_of(self, namespace: str, cluster: str) -> str:
        if self.ray.gcs_override:
            return self.ray.gcs_override
        known = self._addresses.get((namespace, cluster))
        if known:
            return known
        kube = await asyncio.to_thread(self.kube.read_cluster, namespace, cluster)
        return self._address(kube, None)

    # --- activities --------------------------------------------------------------------
    @activity.defn(name=Act.OBSERVE)
    async def observe_cluster(self, inp: ObserveInput) -> Observation:
        try:
            kube = await asyncio.to_thread(self.kube.read_cluster, inp.namespace, inp.cluster)
        except ClusterGone:
            return Observation(found=False)
        except KubeError as exc:
            raise exc.to_application_error() from exc
        address = self._address(kube, inp.gcs_address)
        if not kube.groups.ok:
            return Observation(
                config_errors=kube.groups.errors,
                ippr_enabled=kube.groups.ippr_enabled,
                in_tree_autoscaling=kube.in_tree_autoscaling,
                resource_version=kube.resource_version,
                gcs_address=address,
                pods_version=kube.pods_version,
                cluster_mark=kube.mark,
            )
        try:
            state = await asyncio.to_thread(self.gcs(address).cluster_state)
        except RayError as exc:
            raise _ray_error(exc) from exc
        finally:
            _count_state_reads(inp.namespace, inp.cluster, 1)
        snapshot = join(kube, state, self.settings)
        return Observation(
            snapshot=snapshot,
            ippr_enabled=kube.groups.ippr_enabled,
            in_tree_autoscaling=kube.in_tree_autoscaling,
            replicas=kube.replicas,
            workers_to_delete=kube.workers_to_delete,
            resource_version=kube.resource_version,
            gcs_address=address,
            gcs_version=state.fingerprint,
            pods_version=kube.pods_version,
            cluster_mark=kube.mark,
            resizing=tuple(
                sorted(
                    {
                        *kube.resizing,
                        *(
                            p.name
                            for p in snapshot.pods
                            if p.resize is not None and p.resize.state.in_flight
                        ),
                    }
                )
            ),
        )

    @activity.defn(name=Act.WAIT_FOR_CHANGE)
    async def wait_for_change(self, inp: WaitInput) -> bool:
        """Long-poll: True as soon as the cluster's pods, the RayCluster's spec or
        annotations, or (with `watch_ray`) what Ray reports change; False when
        `timeout_s` passes quietly."""
        started = time.monotonic()
        deadline = started + inp.timeout_s
        assert self.pods is not None
        reads = 0
        beat = started  # heartbeats cross into the SDK's core: every few seconds is enough
        # the worker's shared watches: no thread or connection of its own per wait
        with self.pods.subscribe_cluster(inp.namespace, inp.cluster) as changed:
            try:
                while (left := deadline - time.monotonic()) > 0:
                    if activity.is_worker_shutdown():
                        # the worker is stopping: end now (as a quiet tick), so its
                        # shutdown need not wait out its grace period for this wait
                        return False
                    if self.pods.cluster_changed_since(
                        inp.namespace, inp.cluster, inp.pods_version, inp.cluster_mark
                    ):
                        return True
                    if time.monotonic() - beat >= HEARTBEAT_EVERY_S or not inp.watch_ray:
                        # heartbeats are what tell Temporal this worker still waits
                        activity.heartbeat()
                        beat = time.monotonic()
                    if not inp.watch_ray:
                        await changed.wait(min(left, HEARTBEAT_EVERY_S))
                        continue
                    asked = time.monotonic()
                    reads += 1
                    gcs = self.gcs(inp.gcs_address)
                    try:
                        if await gcs.read_fingerprint() != inp.gcs_version:
                            return True
                    except RayError:
                        return True  # let the next observe say what is wrong
                    now = time.monotonic()
                    pause = next_read_pause(asked - started, now - asked, now, gcs.cadence)
                    await changed.wait(min(pause, left))
                return False
            finally:
                _count_state_reads(inp.namespace, inp.cluster, reads)

    @activity.defn(name=Act.RESIZE_RAYLET)
    async def resize_raylet(self, inp: RayletResizeInput) -> RayletResizeResult:
        return await self._resize_raylet(inp)

    @activity.defn(name=Act.FINISH_RESIZE)
    async def finish_resize(self, inp: FinishResizeInput) -> FinishResizeResult:
        """The pod has its new size: bring the Raylet to it (the reply is the truth), then
        write the pod's final ray.io/ippr-status. Both steps are idempotent, so a retry
        repeats them safely. A status Kubernetes refuses does not undo a done resize: it
        is reported back instead."""
        applied = await self._resize_raylet(inp)
        try:
            await asyncio.to_thread(self.kube.set_ippr_status, inp.namespace, inp.pod, inp.status)
        except (Invalid, Forbidden) as exc:
            log.warning("%s/%s: ray.io/ippr-status not written: %s", inp.namespace, inp.pod, exc)
            return FinishResizeResult(cpu=applied.cpu, memory=applied.memory, status_error=str(exc))
        except KubeError as exc:
            raise exc.to_application_error() from exc
        return FinishResizeResult(cpu=applied.cpu, memory=applied.memory)

    async def _resize_raylet(self, inp: RayletResizeInput) -> RayletResizeResult:
        try:
            address = await self._address_of(inp.namespace, inp.cluster)
        except ClusterGone:
            raise _pod_gone(inp, "its RayCluster is gone") from None
        try:
            applied = await asyncio.to_thread(
                self.gcs(address).resize_raylet, inp.node_id, inp.cpu / 1000.0, inp.memory
            )
        except RayError as exc:
            if exc.retryable:
                # Temporal retries this until it takes; a pod (or cluster) deleted meanwhile
                # would keep the saga retrying a GCS that is gone for ever: look first
                await self._raise_if_pod_gone(inp)
            raise _ray_error(exc) from exc
        return RayletResizeResult(cpu=applied.get_units(CPU), memory=applied.get_units(MEMORY))

    async def _raise_if_pod_gone(self, inp: RayletResizeInput) -> None:
        try:
            pod = await asyncio.to_thread(self.kube.find_pod, inp.namespace, inp.pod)
        except KubeError:
            return  # unknown: the Ray error stands, and the next attempt looks again
        if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
            raise _pod_gone(inp, "the pod is gone (deleted while its Raylet was being resized)")


RECHECK_AFTER_S = 120.0


@dataclass
class DiscoveryActivities:
    """Find RayClusters to manage and make sure each has its reconcile workflow."""

    kube: Kube
    temporal: Client
    task_queue: str
    start_input: Callable[[str, str], ReconcileInput]
    opt_in_annotation: str = "raysize.io/enabled"
    # reconcile ids seen running (or canceled), and when: a hundred clusters need not be
    # described every round; one that ended is restarted within RECHECK_AFTER_S
    _seen: dict[str, float] = field(default_factory=dict)

    @activity.defn(name=Act.LIST_CLUSTERS)
    async def list_rayclusters(self, namespaces: list[str]) -> list[tuple[str, str]]:
        """(namespace, name) of clusters with ray.io/ippr or the opt-in annotation."""
        out: list[tuple[str, str]] = []
        for ns in namespaces or [""]:
            try:
                items = await asyncio.to_thread(list_rayclusters, self.kube, ns)
            except (Forbidden, NotFound) as exc:
                # one namespace raysize may not read (no Role there, or not created yet)
                # must not stop discovery in the others: say so, and go on
                log.warning("discovery skips namespace %r: %s", ns, exc)
                continue
            except KubeError as exc:  # one line, typed: "cannot reach … at …: refused"
                raise exc.to_application_error() from None
            for rc in items:
                meta = rc.get("metadata") or {}
                ann = meta.get("annotations") or {}
                if "ray.io/ippr" in ann or ann.get(self.opt_in_annotation) == "true":
                    out.append((meta.get("namespace", ns), meta["name"]))
        return sorted(out)

    @activity.defn(name=Act.ENSURE_RECONCILERS)
    async def ensure_reconcilers(self, clusters: list[tuple[str, str]]) -> int:
        """Start a reconcile workflow for each cluster that has none running.

        A cluster whose last reconcile was canceled (`raysize stop`, or `temporal workflow
        cancel`) stays unmanaged: that was an operator's decision, and only `raysize start`
        undoes it."""
        started = 0
        for ns, name in clusters:
            wf_id = reconcile_workflow_id(ns, name)
            if time.monotonic() - self._seen.get(wf_id, -RECHECK_AFTER_S) < RECHECK_AFTER_S:
                continue
            try:
                desc = await self.temporal.get_workflow_handle(wf_id).describe()
                if desc.status in (
                    WorkflowExecutionStatus.RUNNING,
                    WorkflowExecutionStatus.CANCELED,
                ):
                    self._seen[wf_id] = time.monotonic()
                    continue
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
            await start_reconciler(self.temporal, self.start_input(ns, name), self.task_queue)
            log.info("started %s: RayCluster %s/%s is managed by raysize", wf_id, ns, name)
            started += 1
        return started
