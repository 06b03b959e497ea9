"""`raysize worker`: the process that runs raysize's workflows and activities."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypedDict

from kubernetes.client.exceptions import ApiException
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.runtime import Runtime
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker, WorkflowRunner

from raysize.activities.cluster import ClusterActivities, RaySettings
from raysize.activities.discovery import DiscoveryActivities
from raysize.activities.k8s import Kube, KubeconfigError
from raysize.activities.observe_only import ObserveOnly
from raysize.activities.ray_errors import RayError
from raysize.activities.ray_gcs import TlsConfig, resolve_token
from raysize.activities.targets import Targets
from raysize.worker.deployment import (
    deployment_config,
    describe_versioning,
    keep_loops_on_current,
    settle_current_version,
)
from raysize.worker.health import heartbeat, heartbeat_path, temporal_state_path
from raysize.worker.settings import Settings
from raysize.worker.takeover import Takeover
from raysize.worker.telemetry import Telemetry, setup_telemetry
from raysize.worker.temporal import (
    SetupError,
    TemporalWatch,
    connect,
    ensure_search_attributes,
)
from raysize.workflows.contracts import LoopSettings, ReconcileInput
from raysize.workflows.discovery_workflow import DiscoveryInput, DiscoveryWorkflow
from raysize.workflows.reconcile_workflow import ReconcileWorkflow
from raysize.workflows.resize_workflow import PodResizeWorkflow

log = logging.getLogger("raysize.worker")

WORKFLOWS = [ReconcileWorkflow, PodResizeWorkflow, DiscoveryWorkflow]

# The collector's thresholds in a worker (Python's default: 700, 10, 10). A tick at
# 5,000 pods makes some hundred thousand short-lived objects (the snapshot, the plan, a
# LIST's JSON); at 700 many outlive a young collection, and the heap's full collections
# (every object the worker keeps: the pod cache, the cached workflows) ran two or three
# times a tick, 0.3–0.5 s of it (timed by hand with `gc.callbacks`; the ticks themselves
# in `bench.scale_bench`). A tick's objects now die by reference count before the first
# collection. Cyclic garbage waits for at most 50,000 allocations more: a few MB.
GC_THRESHOLDS = (50_000, 10, 10)


def tune_gc() -> int:
    """Set the worker's collector (`GC_THRESHOLDS`) and move what start-up made (modules,
    classes, the clients' tables) out of its sight: `gc.freeze()`, after a collection,
    so no full collection walks them again. Once per process, before serving. Returns the
    objects frozen."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    frozen = gc.get_freeze_count()
    log.debug(
        "garbage collector: thresholds %s, %d objects of start-up frozen",
        "/".join(str(t) for t in GC_THRESHOLDS),
        frozen,
    )
    return frozen


def reconcile_input(settings: Settings) -> Callable[[str, str], ReconcileInput]:
    def make(namespace: str, cluster: str) -> ReconcileInput:
        return ReconcileInput(
            namespace=namespace,
            cluster=cluster,
            kube_cluster=settings.cluster_name,
            follow_worker=True,
        ).with_loop(loop_settings(settings))

    return make


def loop_settings(settings: Settings) -> LoopSettings:
    """What a loop that follows its worker decides with (`LoopSettings`): this worker's
    configuration, sent with every observe it runs."""
    return LoopSettings(
        tick_s=settings.tick_s,
        max_concurrent_resizes=settings.max_concurrent_resizes,
        resize_poll_interval_s=settings.resize_poll_interval_s,
        settings=settings.planner(),
    )


def workflow_runner() -> WorkflowRunner:
    """Workflows run outside Temporal's sandbox.

    Our `raysize.workflows` package is deterministic by construction (pure code, no I/O,
    no module state that changes; the import contracts keep I/O out of it, and recorded
    histories replay on it in CI: see docs/design/architecture.md). The sandbox therefore had it
    passed through, since re-importing it for each run cost a fifth of the worker's CPU at
    1,000 resizes, so it checked none of raysize's code but for calls of the builtins
    `open` and `input` (a test looks for those now). What it still cost: every
    activation, and every payload of every workflow task's answer (three times: encoding,
    external storage, references), ran code in it through `exec` on the worker's event
    loop, the loop every activity shares. In a 1,000-cluster burst that was a fifth of that
    loop's busy time (py-spy)."""
    return UnsandboxedWorkflowRunner()


NAMESPACE_PROBE = "raysize-namespace-check"


def namespace_problem(kube: Kube, namespace: str) -> str | None:
    """Why raysize cannot act in a watched namespace, or None.

    Listing a namespace that does not exist returns nothing, as an empty one does, so
    discovery cannot tell. Creating an Event (which raysize may, in every namespace it
    watches) can: as a dry run, which stores nothing, the API server answers 404 for a
    namespace that does not exist and 403 where raysize has no Role (the per-namespace
    install grants in namespaces that exist). Any other answer is left to the first observe,
    which reports its own errors."""
    body: Any = {  # the client takes a dict as well as its CoreV1Event
        "metadata": {"name": NAMESPACE_PROBE, "namespace": namespace},
        "involvedObject": {
            "kind": "RayCluster",
            "apiVersion": "ray.io/v1",
            "namespace": namespace,
            "name": NAMESPACE_PROBE,
        },
        "reason": "RaysizeNamespaceCheck",
        "message": "dry run: does raysize's namespace exist",
        "type": "Normal",
        "source": {"component": "raysize"},
    }
    try:
        kube.core.create_namespaced_event(
            namespace, body, dry_run="All", _request_timeout=kube.timeout_s
        )
    except ApiException as exc:
        if exc.status == 404:
            return (
                f"RAYSIZE_NAMESPACES: namespace {namespace!r} does not exist; raysize keeps "
                "watching it and manages its RayClusters once it is created (with raysize's "
                "Role in it, deploy/watched-namespace)"
            )
        if exc.status == 403:
            return (
                f"RAYSIZE_NAMESPACES: raysize may not act in namespace {namespace!r}: it does "
                "not exist yet, or raysize has no Role there (deploy/watched-namespace); nothing "
                "in it is managed until both are there"
            )
    except Exception:  # unreachable or slow: the first observe says so, with its own error
        return None
    return None


def warn_about_watched_namespaces(kube: Kube, namespaces: list[str]) -> None:
    """One WARNING line for each watched namespace raysize cannot act in; it keeps running,
    as the namespace may be created later."""
    for namespace in namespaces:
        problem = namespace_problem(kube, namespace)
        if problem:
            log.warning(problem)


def discovery_id(settings: Settings) -> str:
    return f"discovery/{settings.task_queue}"


def ray_settings(settings: Settings) -> RaySettings:
    """How the worker talks to Ray, checked before it starts: a token file or TLS files
    that cannot be read would otherwise fail every GCS call, over and over, later."""
    try:
        tls = TlsConfig.from_env()
        token = resolve_token(settings.ray_token)
    except RayError as exc:
        raise SetupError(str(exc)) from None
    if tls is not None:
        for variable, path in (
            ("RAY_TLS_CA_CERT", tls.ca_cert),
            ("RAY_TLS_SERVER_CERT", tls.cert),
            ("RAY_TLS_SERVER_KEY", tls.key),
        ):
            if not path.is_file():
                raise SetupError(
                    f"{variable}: {str(path)!r} is not a file (RAY_USE_TLS is set: point "
                    f"{variable} at the file, or unset RAY_USE_TLS)"
                )
    scope = settings.ray_token_scope()
    if token and not scope.entries:
        log.warning(
            "a Ray token is set (RAYSIZE_RAY_TOKEN, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH) but "
            "RAYSIZE_RAY_TOKEN_FOR names no cluster: it is sent to none. Name the namespaces "
            "or <namespace>/<raycluster> it is for, or * when every cluster is yours"
        )
    elif token:
        log.info("the worker's own Ray token goes to clusters without their own in: %s", scope)
    if token and tls is None and scope.entries:
        log.warning(
            "the worker's own Ray token is sent without TLS (RAY_USE_TLS unset): anyone on "
            "the path to those clusters' GCS can read it"
        )
    return RaySettings(gcs_override=settings.gcs_address, token=token, tls=tls, token_for=scope)


class WorkerSlots(TypedDict):
    max_concurrent_workflow_tasks: int
    max_concurrent_activities: int
    max_concurrent_local_activities: int
    max_cached_workflows: int


def worker_slots(settings: Settings) -> WorkerSlots:
    """The `Worker`'s slots: how many tasks of each kind it runs at once."""
    return {
        # each cluster's observe and Events are local activities, run inside its loop's
        # workflow task, which is held until they end (seconds, in a burst). In a
        # 1,000-cluster burst, Temporal's default of 100 held every slot in observes and
        # new resizes' first tasks waited 100 s in the queue; 1,000 ran so many observes
        # at once that thousands outlived the task's 10 s timeout (docs/design/temporal-notes.md)
        "max_concurrent_workflow_tasks": settings.max_concurrent_workflow_tasks,
        # each cluster's wait holds a slot for minutes: with Temporal's default (100), a
        # hundred clusters left no slot for anything else (a resize waited for a wait to
        # end: reaction 1.3 s instead of 0.2 s)
        "max_concurrent_activities": settings.max_concurrent_activities,
        # one observe or Event at a time per cluster, so as many as it may have clusters
        "max_concurrent_local_activities": settings.max_concurrent_activities,
        "max_cached_workflows": settings.max_cached_workflows,
    }


def build_worker(
    client: Client,
    settings: Settings,
    kube: Kube,
    ray: RaySettings | None = None,
    targets: Targets | None = None,
) -> tuple[Worker, ClusterActivities]:
    """The worker and its cluster activities. `targets`: the threads of every blocking
    call (activities/targets.py), shared by all the activities; the caller closes it
    (`cluster.targets`) after the worker stops."""
    ray = ray or ray_settings(settings)
    targets = targets or Targets()
    cluster = ClusterActivities(
        kube=kube,
        ray=ray,
        settings=settings.planner(),
        observe_only=ObserveOnly(on=settings.observe_only),
        launch_at_size=settings.launch_at_size,
        targets=targets,
        loop=loop_settings(settings),
    )
    discovery = DiscoveryActivities(
        kube=kube,
        temporal=client,
        task_queue=settings.task_queue,
        start_input=reconcile_input(settings),
        kube_cluster=settings.cluster_name,
        targets=targets,
    )
    activities: list[Any] = [
        *cluster.activities(),
        discovery.list_rayclusters,
        discovery.ensure_reconcilers,
    ]
    worker = Worker(
        client,
        task_queue=settings.task_queue,
        workflows=WORKFLOWS,
        activities=activities,
        workflow_runner=workflow_runner(),
        max_concurrent_workflow_task_polls=settings.workflow_task_polls,
        # all 10 (RAYSIZE_WORKFLOW_TASK_POLLS) on the task queue, and one more that core
        # keeps on the worker's sticky queue (core: polls × ratio on the task queue, the
        # rest, at least one, sticky;
        # Temporal's default ratio, 0.2, gives the task queue 2 and the sticky queue 8).
        # The task queue has every new workflow's first task, each resize's among them,
        # and every task of a loop whose worker died or whose sticky task waited 10 s: in
        # a 1,000-cluster burst a resize's first task waited 71 s there at 2 polls, 34 s
        # at 10, and the burst ended after 250–298 s instead of 320–322
        # (docs/design/temporal-notes.md, *What bounds the burst*)
        nonsticky_to_sticky_poll_ratio=1.0,
        max_concurrent_activity_task_polls=10,
        **worker_slots(settings),
        graceful_shutdown_timeout=timedelta(seconds=10),
        # a version of RAYSIZE_DEPLOYMENT_NAME, or unversioned (worker/deployment.py)
        deployment_config=deployment_config(settings),
    )
    return worker, cluster


def use_client(worker: Worker, client: Client) -> None:
    """Hand a new client (new TLS files) to a running worker: its polls and completions
    go through it from now on (calls in flight end on the old one), and so do the
    discovery activities' workflow starts."""
    worker.client = client
    for fn in worker.config().get("activities") or ():
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, DiscoveryActivities):
            owner.temporal = client


async def run_worker(settings: Settings, *, stop: asyncio.Event | None = None) -> None:
    beat = asyncio.create_task(heartbeat())  # liveness: deploy/ probes read this file
    try:
        await _run_worker(settings, stop=stop)
    finally:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat


async def _run_worker(settings: Settings, *, stop: asyncio.Event | None = None) -> None:
    try:
        telemetry = setup_telemetry(settings)
    except ValueError as exc:  # e.g. the Prometheus address is malformed or taken
        raise SetupError(f"telemetry: {exc} (RAYSIZE_PROMETHEUS_BIND, OTEL_*)") from exc
    try:
        await _serve(settings, telemetry, stop=stop)
    finally:
        telemetry.shutdown()


async def _settle(client: Client, settings: Settings) -> None:
    """Make this version current on a first install (`RAYSIZE_MAKE_CURRENT`); a failure is
    logged with the command to run by hand, and the worker keeps serving."""
    try:
        await settle_current_version(client, settings)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        version = settings.deployment_version()
        assert version is not None  # settle fails only when versioned
        log.error(
            "could not check or set the current version of deployment %s: %s. Check with: "
            "temporal worker deployment describe --name %s",
            version.deployment_name,
            exc,
            version.deployment_name,
        )


def takeover_of(client: Client, settings: Settings) -> Takeover | None:
    """What a versioned worker needs to take over a build whose workers are gone
    (`worker/takeover.py`): a replayer with this worker's workflows, runner and
    converter."""
    version = settings.deployment_version()
    if version is None:
        return None
    replayer = Replayer(
        workflows=WORKFLOWS,
        data_converter=client.data_converter,
        workflow_runner=workflow_runner(),
    )
    return Takeover(settings, version, replayer)


async def _serve(
    settings: Settings, telemetry: Telemetry, *, stop: asyncio.Event | None = None
) -> None:
    try:  # before Temporal: a bad kubeconfig is the commoner mistake, and the cheaper check
        kube = Kube.from_kubeconfig(
            str(settings.kubeconfig) if settings.kubeconfig else None,
            qps=settings.kube_qps,
            burst=settings.kube_burst,
            connections=settings.kube_threads,
        )
    except KubeconfigError as exc:
        raise SetupError(str(exc)) from None
    # the Kubernetes errors by kind and the calls held back go out with raysize's other
    # metrics, through the runtime that exports them
    kube.limits.meter = (telemetry.runtime or Runtime.default()).metric_meter
    ray = ray_settings(settings)
    client = await connect(settings, telemetry)
    log.info(
        "telemetry: traces %s, metrics %s",
        "over OTLP" if telemetry.tracer_provider else "off",
        telemetry.metrics_export,
    )
    added = await ensure_search_attributes(client, register=settings.register_search_attributes)
    if added:
        log.info("registered search attributes: %s", ", ".join(added))
    # the worker's threads for blocking calls, per API server and GCS: closed on the way out
    targets = Targets(kube_threads=settings.kube_threads)
    try:
        await targets.kube(
            kube.host, None, warn_about_watched_namespaces, kube, settings.namespace_list()
        )
        worker, cluster = build_worker(client, settings, kube, ray, targets)
    except BaseException:
        targets.close()
        raise
    if settings.discover:
        wanted = DiscoveryInput(
            namespaces=tuple(settings.namespace_list()), interval_s=settings.discovery_interval_s
        )
        discovery = await client.start_workflow(
            DiscoveryWorkflow.run,
            wanted,
            id=discovery_id(settings),
            task_queue=settings.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        # one already running keeps the settings it was started with: this worker's own
        # (RAYSIZE_NAMESPACES, RAYSIZE_DISCOVERY_INTERVAL_S) are in force from its next round
        await discovery.signal(DiscoveryWorkflow.configure, wanted)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    log.info(
        "raysize worker polling %s on %s (namespace %s)",
        settings.task_queue,
        settings.temporal_address,
        settings.temporal_namespace,
    )
    log.info("%s", describe_versioning(settings))
    moving: asyncio.Task[None] | None = None
    takeover = takeover_of(client, settings)

    def keep_moving(client: Client) -> None:
        nonlocal moving
        if moving is not None:
            moving.cancel()
        if settings.deployment_version() is not None:
            moving = asyncio.create_task(keep_loops_on_current(client, settings, takeover))

    def reconnected(new: Client) -> None:
        use_client(worker, new)
        keep_moving(new)

    beat = heartbeat_path()
    watch = TemporalWatch(
        settings,
        client,
        telemetry=telemetry,
        state_file=temporal_state_path(beat) if beat else None,
        on_client=reconnected,
    )
    if settings.observe_only:
        log.warning(
            "observe-only (RAYSIZE_OBSERVE_ONLY=true): raysize plans and says what it would "
            "do (Would* Events, raysize status), and writes to no pod, Raylet or RayCluster; "
            "resizes already running finish or roll back as usual"
        )
    try:
        async with worker:
            settle = asyncio.create_task(_settle(client, settings))
            keep_moving(client)
            watching = asyncio.create_task(watch.run())
            await stop.wait()
            settle.cancel()
            watching.cancel()
            if moving is not None:
                moving.cancel()
            log.info("shutting down: finishing running activities (up to 10 s)")
    finally:
        cluster.close()
        targets.close()
