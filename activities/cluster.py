"""Activities that join Kubernetes and Ray: observe a cluster, wait for it to change,
resize a Raylet and finish a resize.

Observing reads the RayCluster and its pods (Kubernetes) and the nodes, demands, gangs
and constraints (the Ray GCS), and joins them (`activities/snapshot.py`). A read that
fails raises: the workflow treats it as "unknown", never as "nothing".
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from raysize.activities.gcs_cadence import (
    Timetable,
    next_read_pause,
)
from raysize.activities.heartbeats import heartbeats
from raysize.activities.k8s import Kube
from raysize.activities.k8s_activities import K8sActivities
from raysize.activities.k8s_errors import ClusterGone, Forbidden, Invalid, KubeError
from raysize.activities.k8s_objects import KubeCluster, default_gcs_address
from raysize.activities.node_room import NodeRooms
from raysize.activities.observe_only import ObserveOnly
from raysize.activities.pod_watch import PodWatch
from raysize.activities.ray_errors import (
    RayAuthUnavailable,
    RayError,
    RayletNotFound,
    RayUnauthenticated,
    RayUnavailable,
)
from raysize.activities.ray_gcs import DrainReply, RayGcsClient, TlsConfig
from raysize.activities.ray_state import ClusterState
from raysize.activities.ray_tokens import FallbackScope, RayTokens, TokenSource, source_for
from raysize.activities.snapshot import join
from raysize.activities.targets import Targets, calls_of
from raysize.workflows.contracts import (
    HEARTBEAT_TIMEOUT,
    PLAN_DURATION,
    RAY_STATE_READS,
    WAIT_HEARTBEAT_TIMEOUT,
    Act,
    DrainInput,
    DrainResult,
    Err,
    FinishResizeInput,
    FinishResizeResult,
    GcsTimetable,
    LoopSettings,
    Observation,
    ObserveInput,
    RayletResizeInput,
    RayletResizeResult,
    Tick,
    WaitInput,
    WaitResult,
)
from raysize.workflows.decide import decide
from raysize.workflows.model import (
    PlannerSettings,
)
from raysize.workflows.resources import CPU, MEMORY

log = logging.getLogger("raysize.activities")
# an observe this slow (read and plan) says where its time went, in the worker's log
SLOW_OBSERVE_S = 1.0
# how long an observe waits (on the event loop) for the pod watch to deliver this worker's
# own writes to the cluster's pods before its read lists them instead: a LIST under the
# load that holds the watch back took ~11 s in a 1,000-cluster burst
WATCH_CATCH_UP_S = 10.0
# how long the first observes wait for the node-room informers' first lists (once; the
# plan does without the nodes' room until they are in)
NODES_FIRST_WAIT_S = 5.0


@dataclass
class ObserveTimes:
    """Where an observe's time went (seconds), for the slow-observe line."""

    kube_s: float = 0.0  # the RayCluster and its pods
    pods_cached: bool = False  # the pods came from the pod watch, not a LIST
    ray_s: float = 0.0  # Ray's state


# a third of the wait's heartbeat timeout (30 s); the SDK sends at most one every 24 s
HEARTBEAT_EVERY_S = WAIT_HEARTBEAT_TIMEOUT.total_seconds() / 3
# a wait on Kubernetes alone looks this often whether its worker is stopping (it looked at
# each heartbeat, every 4 s, before heartbeats kept a pace of their own)
SHUTDOWN_LOOK_S = 4.0
# a drain beats this often: a third of its heartbeat timeout, whatever a GCS call holds it
DRAIN_HEARTBEAT_EVERY_S = HEARTBEAT_TIMEOUT.total_seconds() / 3
# what the worker keeps for a cluster (its GCS client, address, token source) is freed
# when the cluster is deleted (`ClusterActivities.forget_cluster`); one no activity has
# worked for in this long is forgotten too (a deletion another worker saw, a cluster no
# longer managed): a loop observes at least every tick (`tick_s`, 5 min by default), and
# whatever is forgotten is read again when needed. Looked for at most every SWEEP_EVERY_S
IDLE_FORGET_S = 3600.0
SWEEP_EVERY_S = 60.0
T = TypeVar("T")


def _count_state_reads(namespace: str, cluster: str, n: int) -> None:
    """`raysize_ray_state_reads`: what raysize costs each GCS (read by bench.idle_bench)."""
    if n:
        activity.metric_meter().create_counter(
            RAY_STATE_READS, "GetClusterResourceState calls to the cluster's GCS"
        ).add(n, {"cluster": cluster, "k8s_namespace": namespace})


async def plan_tick(
    obs: Observation, inp: ObserveInput, targets: Targets, *, observe_only: bool = False
) -> Tick:
    """The tick of what was read (`workflows/decide.py`), with the plan's wall time in
    `raysize_plan_duration_seconds`. In an activity only (its metric meter).
    `observe_only`: the worker's RAYSIZE_OBSERVE_ONLY, recorded in the tick."""
    start = time.perf_counter()
    # the planner is pure Python: in a thread (the planner's own, activities/targets.py),
    # so this worker's other activities (and their heartbeats) go on meanwhile
    tick = await targets.plan(functools.partial(decide, observe_only=observe_only), obs, inp)
    elapsed = time.perf_counter() - start
    if tick.plan is not None or tick.would is not None:
        activity.metric_meter().create_histogram_float(
            PLAN_DURATION, "wall time of one tick's plan", "s"
        ).record(elapsed, {"cluster": inp.cluster, "k8s_namespace": inp.namespace})
    return tick.model_copy(update={"plan_s": round(elapsed, 6)})


def _drain(node_id: str, reason: str, gcs: RayGcsClient) -> DrainReply:
    return gcs.drain_node(node_id, reason)


def _secret_of(source: TokenSource | None) -> tuple[str, str] | None:
    """The Secret (namespace, name) a cluster's token is read from, if any."""
    if source is None or source.value is not None or source.fallback or not source.secret:
        return None
    return (source.namespace, source.secret)


def _pod_gone(inp: RayletResizeInput, why: str) -> ApplicationError:
    return ApplicationError(
        f"{inp.namespace}/{inp.pod}: {why}", type=Err.POD_GONE, non_retryable=True
    )


def _ray_error(exc: RayError) -> ApplicationError:
    if isinstance(exc, RayletNotFound):
        kind = Err.RAYLET_GONE
    elif isinstance(exc, RayUnauthenticated) or (
        isinstance(exc, RayAuthUnavailable) and not exc.retryable
    ):
        kind = Err.RAY_AUTH
    else:
        kind = type(exc).__name__
    return ApplicationError(str(exc), type=kind, non_retryable=not exc.retryable)


@dataclass
class RaySettings:
    """How to reach each cluster's GCS."""

    gcs_override: str | None = None  # one address for every cluster (tests, port-forward)
    # the token of clusters without one of their own (activities/ray_tokens.py), sent only
    # to those `token_for` names (RAYSIZE_RAY_TOKEN_FOR)
    token: str | None = None
    token_for: FallbackScope = field(default_factory=FallbackScope)
    tls: TlsConfig | None = None
    timeout_s: float = 10.0

    def dial_address(
        self, namespace: str, name: str, reported: str, override: str | None = None
    ) -> str:
        """Where a RayCluster's GCS is dialled: the loop's own address, else the worker's
        RAYSIZE_GCS_ADDRESS, else what the RayCluster's status reports, else KubeRay's
        head Service."""
        return override or self.gcs_override or reported or default_gcs_address(namespace, name)


@dataclass
class ClusterActivities:
    """Activities joining Kubernetes and Ray. One instance per worker process."""

    kube: Kube
    ray: RaySettings = field(default_factory=RaySettings)
    settings: PlannerSettings = field(default_factory=PlannerSettings)
    # one client per GCS address and token: a cluster whose token changed gets a new one
    _clients: dict[tuple[str, str | None], RayGcsClient] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _addresses: dict[tuple[str, str], str] = field(default_factory=dict)
    # where each cluster's Ray token is (None: the fallback), as its RayCluster last said
    _sources: dict[tuple[str, str], TokenSource | None] = field(default_factory=dict)
    pods: PodWatch | None = None  # set in __post_init__: one pod watch per worker
    # the room of the nodes Ray pods run on (activities/node_room.py); set in __post_init__
    nodes: NodeRooms | None = None
    tokens: RayTokens | None = None  # set in __post_init__: each cluster's own Ray token
    # RAYSIZE_OBSERVE_ONLY: plan and say, never write (activities/observe_only.py)
    observe_only: ObserveOnly = field(default_factory=ObserveOnly)
    # RAYSIZE_LAUNCH_AT_SIZE: the size new pods start at is written (Kube.write_launch_sizes)
    launch_at_size: bool = True
    # the threads of the blocking calls, per API server and GCS (activities/targets.py);
    # the worker passes its own and closes it
    targets: Targets = field(default_factory=Targets)
    # the worker's settings a loop that follows the worker decides with (issue #43 item
    # 5): they replace the loop's own in each observe and are recorded in the tick; None
    # leaves the loop's (tests that start loops with their own)
    loop: LoopSettings | None = None
    # the client (address, token) each cluster was last given: one no cluster is given
    # any more is closed (a cluster deleted, or whose token or address changed)
    _client_of: dict[tuple[str, str], tuple[str, str | None]] = field(default_factory=dict)
    # when an activity last worked for each cluster (`clock`), for IDLE_FORGET_S
    _used: dict[tuple[str, str], float] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    _swept: float = 0.0

    def __post_init__(self) -> None:
        if self.pods is None:
            # its lists and (re)connects take tokens of the same server's budget
            self.pods = PodWatch(
                self.kube.core, self.kube.custom, limits=getattr(self.kube, "limits", None)
            )
        core = getattr(self.kube, "core", None)
        if self.nodes is None and core is not None:
            self.nodes = NodeRooms(core, limits=getattr(self.kube, "limits", None))
        if isinstance(self.kube, Kube) and self.kube.pod_watch is None:
            self.kube.pod_watch = self.pods  # observes read its cache, writes tell it
        if isinstance(self.pods, PodWatch):  # a RayCluster it sees deleted: free its state
            self.pods.on_cluster_deleted.append(self.forget_cluster)
        self._swept = self.clock()
        if self.tokens is None:
            self.tokens = RayTokens(
                lambda ns, name: self.kube.read_secret(ns, name), self.ray.token
            )

    def activities(self) -> list[Callable[..., Any]]:
        return [
            self.observe_cluster,
            self.wait_for_change,
            self.resize_raylet,
            self.finish_resize,
            self.drain_raylets,
            *K8sActivities(
                self.kube,
                self.pods,
                self.observe_only,
                self.targets,
                self._finish_resize,
                launch_at_size=self.launch_at_size,
            ).activities(),
        ]

    # --- helpers --------------------------------------------------------------------
    async def _kube(self, fn: Callable[..., T], *args: Any, write: bool = False) -> T:
        """`fn(*args)` on the threads of the worker's Kubernetes API server (`write`: a
        saga's write, sent before the reads waiting there)."""
        return await self.targets.on_kube(self.kube, fn, *args, write=write)

    async def _gcs(self, address: str, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the threads of the GCS at `address`."""
        return await self.targets.gcs(address, self.ray.timeout_s, fn, *args)

    def gcs(
        self,
        address: str,
        source: TokenSource | None = None,
        cluster: tuple[str, str] | None = None,
    ) -> RayGcsClient:
        """The client for the GCS at `address` with the token at `source` (None: the
        fallback), for `cluster` (namespace, name): the client it had before, if another,
        is closed once no cluster has it. Blocking: the first call for a Secret reads it."""
        assert self.tokens is not None
        token = self.tokens.token(source)
        with self._lock:
            if cluster is not None:
                before = self._client_of.get(cluster)
                self._client_of[cluster] = (address, token)
                if before is not None and before != (address, token):
                    self._release(before)
            client = self._clients.get((address, token))
            if client is None:
                client = RayGcsClient(
                    address,
                    token=token,
                    tls=self.ray.tls,
                    timeout=self.ray.timeout_s,
                    token_from=source.describe() if source is not None else self._unsent(),
                )
                self._clients[(address, token)] = client
            return client

    def _unsent(self) -> str:
        """What a refusal says when no token was sent: the worker's own is not sent to
        this cluster (RAYSIZE_RAY_TOKEN_FOR), or there is none."""
        if not self.ray.token:
            return ""
        named = str(self.ray.token_for) or "none"
        return (
            "the worker's own token (RAYSIZE_RAY_TOKEN) goes only to the clusters "
            f"RAYSIZE_RAY_TOKEN_FOR names ({named}); give the cluster a token of its own "
            "(authOptions), or name it there"
        )

    def _release(self, client: tuple[str, str | None]) -> None:
        """Close the client (address, token) if no cluster has it now (lock held)."""
        if client not in self._client_of.values():
            gone = self._clients.pop(client, None)
            if gone is not None:
                gone.close()

    def _note_source(self, key: tuple[str, str], source: TokenSource | None) -> TokenSource | None:
        """The cluster's token is at `source` now; a Secret it named before and no cluster
        names now leaves the token cache."""
        with self._lock:
            before = self._sources.get(key)
            self._sources[key] = source
        if _secret_of(before) != _secret_of(source):
            self._forget_secret(before)
        return source

    def _forget_secret(self, source: TokenSource | None) -> None:
        secret = _secret_of(source)
        if secret is None or self.tokens is None:
            return
        with self._lock:
            named = any(_secret_of(s) == secret for s in self._sources.values())
        if not named:
            self.tokens.forget(*secret)

    def forget_cluster(self, namespace: str, cluster: str) -> None:
        """Free what this worker keeps for the cluster: its GCS client (closed once no
        other cluster has it: they are shared per address and token), its address, its
        token's source and cached Secret, the pod watch's mark of it. Called when the
        cluster is deleted (its observe finds no RayCluster; the RayCluster watch delivers
        its deletion, on the watch's thread) and for a cluster idle for IDLE_FORGET_S.
        Anything still needed is read again."""
        key = (namespace, cluster)
        with self._lock:
            self._addresses.pop(key, None)
            source = self._sources.pop(key, None)
            self._used.pop(key, None)
            client = self._client_of.pop(key, None)
            if client is not None:
                self._release(client)
        self._forget_secret(source)
        if isinstance(self.pods, PodWatch):
            self.pods.forget_cluster(namespace, cluster)

    def _working_for(self, namespace: str, cluster: str) -> None:
        """An activity works for the cluster: its calls take turns with other clusters'
        (`calls_of`); clusters idle for IDLE_FORGET_S are forgotten."""
        calls_of(namespace, cluster)
        now = self.clock()
        self._used[(namespace, cluster)] = now
        if now - self._swept < SWEEP_EVERY_S:
            return
        self._swept = now
        with self._lock:
            idle = [k for k, t in self._used.items() if now - t > IDLE_FORGET_S]
        for key in idle:
            self.forget_cluster(*key)
        if idle:
            log.info(
                "forgot %d cluster(s) no activity worked for in %.0f s", len(idle), IDLE_FORGET_S
            )

    def cluster_state(self) -> dict[str, int]:
        """How many entries each per-cluster map holds, and the GCS clients open
        (`bench.tenant_churn_bench`, the tests)."""
        with self._lock:
            sizes = {
                "clients": len(self._clients),
                "client_of": len(self._client_of),
                "addresses": len(self._addresses),
                "sources": len(self._sources),
                "used": len(self._used),
            }
        sizes["tokens.cache"] = self.tokens.cached() if self.tokens is not None else 0
        if isinstance(self.pods, PodWatch):
            sizes.update(self.pods.cluster_state())
        return sizes

    async def _source_of(self, namespace: str, cluster: str) -> TokenSource | None:
        """Where the cluster's token is: as the last observe read it, else from its
        RayCluster now (a worker that restarted mid-resize)."""
        key = (namespace, cluster)
        if key not in self._sources:
            kube = await self._kube(self.kube.read_cluster, namespace, cluster)
            return self._note_source(key, source_for(kube.raycluster, self.ray.token_for))
        return self._sources.get(key)

    async def _ray_call(
        self,
        source: TokenSource | None,
        address: str,
        call: Callable[[RayGcsClient], T],
        cluster: tuple[str, str] | None = None,
    ) -> T:
        """`call` on the cluster's GCS with its token. Refused for the token: its Secret
        is read again, and when it changed (rotated), the call is made once more with
        the new token; otherwise the refusal stands."""

        def ask() -> T:  # one thread hop: the client (cached) and the call
            return call(self.gcs(address, source, cluster))

        try:
            return await self._gcs(address, ask)
        except RayUnauthenticated:
            assert self.tokens is not None
            if source is None or not await self._kube(self.tokens.refresh, source):
                raise
        assert source is not None
        log.info("the Ray token at %s changed: asking %s again with it", source.describe(), address)
        return await self._gcs(address, ask)

    def close(self) -> None:
        if self.pods is not None:
            self.pods.close()
        if self.nodes is not None:
            self.nodes.close()
        with self._lock:
            for c in self._clients.values():
                c.close()
            self._clients.clear()
            self._client_of.clear()

    def _address(self, kube: KubeCluster, override: str | None) -> str:
        """Where the cluster's GCS is dialled, remembered for the Raylet resizes when the
        cluster itself says it (its loop's address, or its status). KubeRay's default
        head Service, used until the status says, is not remembered: a worker that saw a
        cluster only before KubeRay reported its GCS dialled that name for good, and its
        Raylet syncs failed where the Service's name does not resolve."""
        address = self.ray.dial_address(kube.namespace, kube.name, kube.gcs_address, override)
        if override or kube.gcs_address:
            self._addresses[(kube.namespace, kube.name)] = address
        return address

    async def _address_of(self, namespace: str, cluster: str) -> str:
        if self.ray.gcs_override:
            return self.ray.gcs_override
        known = self._addresses.get((namespace, cluster))
        if known:
            return known
        kube = await self._kube(self.kube.read_cluster, namespace, cluster)
        self._sources.setdefault(
            (namespace, cluster), source_for(kube.raycluster, self.ray.token_for)
        )
        return self._address(kube, None)

    def _forget_address(self, namespace: str, cluster: str) -> None:
        """The GCS did not answer at the address remembered: the next call reads the
        RayCluster again (a head pod started again may be elsewhere)."""
        self._addresses.pop((namespace, cluster), None)

    # --- activities --------------------------------------------------------------------
    @activity.defn(name=Act.OBSERVE)
    async def observe_cluster(self, inp: ObserveInput) -> Tick:
        """Read the RayCluster, its pods and Ray, and plan on what was read: the workflow
        records the decision (`workflows/decide.py`), never the snapshot."""
        self._working_for(inp.namespace, inp.cluster)
        started = time.perf_counter()
        took = ObserveTimes()
        if self.loop is not None and inp.follow_worker:
            inp = inp.model_copy(
                update={
                    "settings": self.loop.settings,
                    "max_resizes": self.loop.max_concurrent_resizes,
                }
            )
        obs = await self.observe(inp, took)
        tick = await plan_tick(obs, inp, self.targets, observe_only=self.observe_only.on)
        if self.loop is not None:
            tick = tick.model_copy(update={"in_force": self.loop})
        total = time.perf_counter() - started
        if total >= SLOW_OBSERVE_S:
            # which part: the Kubernetes read (a cached read waits for this worker's own pod
            # writes to come back through the watch, or lists), Ray's state, or the plan
            log.info(
                "%s/%s: observe took %.2f s: Kubernetes %.2f s (%s), Ray %.2f s, plan %.2f s",
                inp.namespace,
                inp.cluster,
                total,
                took.kube_s,
                "pods from the watch" if took.pods_cached else "pods listed",
                took.ray_s,
                tick.plan_s,
            )
        return tick

    async def observe(self, inp: ObserveInput, took: ObserveTimes | None = None) -> Observation:
        """The RayCluster, its pods and Ray, joined (`activities/snapshot.py`); `took` gets
        how long the Kubernetes and the Ray reads took."""
        took = ObserveTimes() if took is None else took
        started = time.perf_counter()
        if self.pods is not None:
            # this worker's own writes to the pods through the watch first, waited for
            # here on the event loop: under load the read would list instead
            await self.pods.delivered(inp.namespace, inp.cluster, WATCH_CATCH_UP_S)
        try:
            # the pods from the pod watch's cache once it is synced (a LIST until then)
            kube = await self._kube(
                functools.partial(self.kube.read_cluster, cached=True), inp.namespace, inp.cluster
            )
        except ClusterGone:
            # deleted: what this worker keeps for it goes (the loop ends on this)
            self.forget_cluster(inp.namespace, inp.cluster)
            return Observation(found=False)
        except KubeError as exc:
            raise exc.to_application_error() from None
        took.kube_s, took.pods_cached = time.perf_counter() - started, kube.pods_cached
        address = self._address(kube, inp.gcs_address)
        source = self._note_source(
            (inp.namespace, inp.cluster), source_for(kube.raycluster, self.ray.token_for)
        )
        if not kube.groups.ok:
            return Observation(
                config_errors=kube.groups.errors,
                ippr_enabled=kube.groups.ippr_enabled,
                in_tree_autoscaling=kube.in_tree_autoscaling,
                ray_autoscaler_pod=kube.ray_autoscaler_pod,
                resource_version=kube.resource_version,
                gcs_address=address,
                pods_version=kube.pods_version,
                cluster_mark=kube.mark,
            )
        asked = time.perf_counter()
        try:
            state, answered, published = await self._ray_call(
                source, address, _read_state, (inp.namespace, inp.cluster)
            )
        except RayError as exc:
            raise _ray_error(exc) from None
        finally:
            _count_state_reads(inp.namespace, inp.cluster, 1)
            took.ray_s = time.perf_counter() - asked
        snapshot = join(kube, state, self.settings)
        bound = {p.node for p in snapshot.pods if p.node}
        if bound and self.nodes is not None:
            # how much room each of its pods' nodes has left: grows stay within it (the
            # informers' first lists are waited for a moment, once)
            await self.nodes.started(NODES_FIRST_WAIT_S)
            snapshot = snapshot.model_copy(update={"nodes": self.nodes.rooms(bound)})
        return Observation(
            snapshot=snapshot,
            ippr_enabled=kube.groups.ippr_enabled,
            in_tree_autoscaling=kube.in_tree_autoscaling,
            ray_autoscaler_pod=kube.ray_autoscaler_pod,
            replicas=kube.replicas,
            workers_to_delete=kube.workers_to_delete,
            resource_version=kube.resource_version,
            generation=kube.generation,
            stale_to_delete=kube.stale_to_delete,
            gcs_address=address,
            gcs_version=state.fingerprint,
            pods_version=kube.pods_version,
            cluster_mark=kube.mark,
            ray_read_at=answered,
            demand_published=published,
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
    async def wait_for_change(self, inp: WaitInput) -> WaitResult:
        """Long-poll: changed as soon as the cluster's pods, the RayCluster's spec or
        annotations, or (with `watch_ray`) what Ray reports change; not when `timeout_s`
        passes quietly. With what this worker knows of when the GCS publishes demands,
        for the next wait (the reconcile hands it on: `WaitInput.gcs_timetable`)."""
        self._working_for(inp.namespace, inp.cluster)
        changed, gcs = await self._wait_for_change(inp)
        learned = None if gcs is None else gcs.cadence.timetable(time.time() - time.monotonic())
        return WaitResult(
            changed=changed,
            gcs_timetable=None
            if learned is None
            else GcsTimetable(address=inp.gcs_address, **dataclasses.asdict(learned)),
        )

    async def _wait_for_change(self, inp: WaitInput) -> tuple[bool, RayGcsClient | None]:
        """`wait_for_change`: whether anything changed, and the GCS's client if it was
        read."""
        started = time.monotonic()
        deadline = started + inp.timeout_s
        assert self.pods is not None
        reads = 0
        # the worker's shared watches: no thread or connection of its own per wait
        with (
            self.pods.subscribe_cluster(inp.namespace, inp.cluster) as changed,
            heartbeats(HEARTBEAT_EVERY_S),
        ):
            # from here on, any change of a pod the watch delivers is news
            changes = self.pods.cluster_changes(inp.namespace, inp.cluster)
            if await self._pods_changed_since_observe(inp):
                return True, None
            gcs, adopted = None, False
            if inp.watch_ray:
                try:
                    source = await self._source_of(inp.namespace, inp.cluster)
                    gcs = await self._gcs(
                        inp.gcs_address,
                        self.gcs,
                        inp.gcs_address,
                        source,
                        (inp.namespace, inp.cluster),
                    )
                except (RayError, KubeError):
                    return True, None  # let the next observe say what is wrong
                given = inp.gcs_timetable
                if given is not None and given.address == inp.gcs_address:
                    handed = Timetable(**given.model_dump(exclude={"address"}))
                    adopted = gcs.cadence.adopt(handed, time.time() - time.monotonic())
            try:
                while (left := deadline - time.monotonic()) > 0:
                    if activity.is_worker_shutdown():
                        # the worker is stopping: end now (as a quiet tick), so its
                        # shutdown need not wait out its grace period for this wait
                        return False, gcs
                    if self.pods.cluster_changed_since(
                        inp.namespace, inp.cluster, changes, inp.cluster_mark
                    ):
                        return True, gcs
                    if gcs is None:
                        # Kubernetes only: the watch wakes it; a stopping worker is
                        # looked for meanwhile
                        await changed.wait(min(left, SHUTDOWN_LOOK_S))
                        continue
                    asked = time.monotonic()
                    reads += 1
                    try:
                        if await gcs.read_fingerprint() != inp.gcs_version:
                            if log.isEnabledFor(logging.DEBUG):
                                _log_ray_change(inp, reads, asked - started, gcs, adopted)
                            return True, gcs
                    except RayError:
                        return True, gcs  # let the next observe say what is wrong
                    now = time.monotonic()
                    pause = next_read_pause(asked - started, now - asked, now, gcs.cadence)
                    await changed.wait(min(pause, left))
                return False, gcs
            finally:
                _count_state_reads(inp.namespace, inp.cluster, reads)

    @activity.defn(name=Act.DRAIN)
    async def drain_raylets(self, inp: DrainInput) -> DrainResult:
        """Ask Ray to drain each Raylet before its pod is removed (idle termination, as
        Ray's own autoscaler does): a Raylet that runs work refuses, and one that accepts
        takes no new work. Safe to repeat: a drained Raylet is dead, and Ray accepts a
        dead or unknown node at once. A drain that could not be asked (the GCS down, say)
        counts as refused, so its pod stays; those accepted before it still go."""
        self._working_for(inp.namespace, inp.cluster)
        await self.observe_only.refuse(
            f"drain of {len(inp.targets)} Raylet(s) of {inp.namespace}/{inp.cluster}"
        )
        # it heartbeats (`HEARTBEAT_TIMEOUT`): a worker that dies mid-drain is noticed in
        # seconds, not after the drain's start-to-close (17 minutes at 100 pods)
        with heartbeats(DRAIN_HEARTBEAT_EVERY_S):
            return await self._drain_raylets(inp)

    async def _drain_raylets(self, inp: DrainInput) -> DrainResult:
        accepted: list[str] = []
        refused: dict[str, str] = {}
        try:
            source = await self._source_of(inp.namespace, inp.cluster)
        except KubeError as exc:
            why = f"the drain could not be asked: its RayCluster could not be read: {exc}"
            return DrainResult(refused={t.pod: why for t in inp.targets})
        for t in inp.targets:
            try:
                reply = await self._ray_call(
                    source,
                    inp.gcs_address,
                    functools.partial(_drain, t.node_id, t.reason),
                    (inp.namespace, inp.cluster),
                )
            except RayError as exc:
                refused[t.pod] = f"the drain could not be asked: {exc}"
                log.warning("%s/%s: %s kept: %s", inp.namespace, inp.cluster, t.pod, refused[t.pod])
                continue
            if reply.accepted:
                accepted.append(t.pod)
            else:
                refused[t.pod] = reply.rejection or "Ray refused the drain and gave no reason"
            log.info(
                "%s/%s: drain of %s (Raylet %s) %s",
                inp.namespace,
                inp.cluster,
                t.pod,
                t.node_id[:12],
                "accepted" if reply.accepted else f"refused: {refused[t.pod]}",
            )
        return DrainResult(accepted=tuple(accepted), refused=refused)

    async def _pods_changed_since_observe(self, inp: WaitInput) -> bool:
        """Did a pod of the cluster change between the observe and this wait? Its pods'
        mark (`pods_mark`: names and resourceVersions, compared for equality only, as
        resourceVersions are opaque) against the watch's copy. The observe read that copy
        when the watch was synced, so a mark that differs now is news; otherwise (the
        observe listed, and the watch may be a moment behind, or has not listed yet) it
        is checked against a list."""
        if not inp.pods_version:
            return False  # the observe did not list the pods
        assert self.pods is not None
        mark = self.pods.cluster_pods_mark(inp.namespace, inp.cluster)
        if mark == inp.pods_version:
            return False
        if mark is not None and self.pods.synced(inp.namespace):
            return True
        try:
            _, now = await self._kube(
                self.kube.list_cluster_pod_metadata, inp.namespace, inp.cluster
            )
        except KubeError:
            return False  # unknown: wait; the watch still wakes this wait, the tick ends it
        return now != inp.pods_version

    @activity.defn(name=Act.RESIZE_RAYLET)
    async def resize_raylet(self, inp: RayletResizeInput) -> RayletResizeResult:
        self._working_for(inp.namespace, inp.cluster)
        await self.observe_only.refuse(f"Raylet resize of pod {inp.namespace}/{inp.pod}")
        return await self._resize_raylet(inp)

    @activity.defn(name=Act.FINISH_RESIZE)
    async def finish_resize(self, inp: FinishResizeInput) -> FinishResizeResult:
        """The pod has its new size: bring the Raylet to it (the reply is the truth), then
        write the pod's final ray.io/ippr-status. Both steps are idempotent, so a retry
        repeats them safely. A status Kubernetes refuses does not undo a done resize: it
        is reported back instead."""
        self._working_for(inp.namespace, inp.cluster)
        await self.observe_only.refuse(f"Raylet resize of pod {inp.namespace}/{inp.pod}")
        return await self._finish_resize(inp)

    async def _finish_resize(self, inp: FinishResizeInput) -> FinishResizeResult:
        """`finish_resize`'s work; an apply with `finish` does it too, in its own activity
        (`K8sActivities.apply_resize`), once the kubelet is done."""
        applied = await self._resize_raylet(inp)
        try:
            await self._kube(
                self.kube.set_ippr_status,
                inp.namespace,
                inp.pod,
                inp.status,
                inp.pod_uid,
                write=True,
            )
        except (Invalid, Forbidden) as exc:
            log.warning("%s/%s: ray.io/ippr-status not written: %s", inp.namespace, inp.pod, exc)
            return FinishResizeResult(cpu=applied.cpu, memory=applied.memory, status_error=str(exc))
        except KubeError as exc:
            raise exc.to_application_error() from None
        return FinishResizeResult(cpu=applied.cpu, memory=applied.memory)

    async def _resize_raylet(self, inp: RayletResizeInput) -> RayletResizeResult:
        try:
            address = await self._address_of(inp.namespace, inp.cluster)
            source = await self._source_of(inp.namespace, inp.cluster)
        except ClusterGone:
            raise _pod_gone(inp, "its RayCluster is gone") from None
        except KubeError as exc:
            raise exc.to_application_error() from None
        try:
            applied = await self._ray_call(
                source,
                address,
                lambda gcs: gcs.resize_raylet(inp.node_id, inp.cpu / 1000.0, inp.memory),
                (inp.namespace, inp.cluster),
            )
        except RayError as exc:
            if isinstance(exc, RayUnavailable):
                self._forget_address(inp.namespace, inp.cluster)
            if exc.retryable or isinstance(exc, RayletNotFound):
                # Temporal retries this until it takes; a pod (or cluster) deleted meanwhile
                # would keep the saga retrying a GCS that is gone for ever: look first. A
                # Raylet not found may be its pod gone (or replaced): then say the pod.
                await self._raise_if_pod_gone(inp)
            raise _ray_error(exc) from None
        return RayletResizeResult(cpu=applied.get_units(CPU), memory=applied.get_units(MEMORY))

    async def _raise_if_pod_gone(self, inp: RayletResizeInput) -> None:
        try:
            pod = await self._kube(self.kube.find_pod, inp.namespace, inp.pod, inp.pod_uid)
        except KubeError:
            return  # unknown: the Ray error stands, and the next attempt looks again
        if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
            raise _pod_gone(
                inp, "the pod is gone (deleted, or replaced, while its Raylet was being resized)"
            )


def _read_state(gcs: RayGcsClient) -> tuple[ClusterState, float, tuple[float, float] | None]:
    """Ray's state; when the read was answered, and the (earliest, latest) instant of the
    GCS's last task-demand publication before it was sent (`GcsCadence.last_publication`),
    in epoch seconds: a grow's hold ends at the first publication after it landed
    (`deadlines.GrowWatch`)."""
    sent = time.monotonic()
    state = gcs.cluster_state()
    answered = time.monotonic()
    published = gcs.cadence.last_publication(sent)
    to_epoch = time.time() - time.monotonic()
    window = None if published is None else (published[0] + to_epoch, published[1] + to_epoch)
    return state, answered + to_epoch, window


def _log_ray_change(
    inp: WaitInput, reads: int, after_s: float, gcs: RayGcsClient, adopted: bool
) -> None:
    """How a wait saw Ray's state change: with a timetable it reads just after the GCS
    publishes demands, without one at a steady pace (`activities.gcs_cadence`)."""
    upcoming = gcs.cadence.next_publication(time.monotonic())
    known = (
        "not known"
        if upcoming is None
        else f"known to {1000 * (upcoming[1] - upcoming[0]):.0f} ms"
        + (" (handed to this wait)" if adopted else "")
    )
    log.debug(
        "%s/%s: Ray's state changed: seen by read %d of this wait, %.2fs into it; the "
        "GCS's demand timetable %s",
        inp.namespace, inp.cluster, reads, after_s, known,
    )  # fmt: skip
