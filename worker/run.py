"""`raysize worker`: the process that runs raysize's workflows and activities."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.cluster import ClusterActivities, DiscoveryActivities, RaySettings
from activities.k8s import Kube, KubeconfigError
from activities.ray_gcs import TlsConfig, resolve_token
from worker.health import heartbeat
from worker.settings import Settings
from worker.telemetry import Telemetry, setup_telemetry
from worker.temporal import SetupError, connect, ensure_search_attributes
from workflows.contracts import ReconcileInput
from workflows.discovery_workflow import DiscoveryInput, DiscoveryWorkflow
from workflows.reconcile_workflow import ReconcileWorkflow
from workflows.resize_workflow import PodResizeWorkflow

log = logging.getLogger("raysize.worker")

WORKFLOWS = [ReconcileWorkflow, PodResizeWorkflow, DiscoveryWorkflow]


def reconcile_input(settings: Settings) -> Callable[[str, str], ReconcileInput]:
    def make(namespace: str, cluster: str) -> ReconcileInput:
        return ReconcileInput(
            namespace=namespace,
            cluster=cluster,
            tick_s=settings.tick_s,
            max_concurrent_resizes=settings.max_concurrent_resizes,
            resize_poll_interval_s=settings.resize_poll_interval_s,
            settings=settings.planner(),
        )

    return make


def workflow_runner() -> SandboxedWorkflowRunner:
    """The sandbox, with raysize's own workflow modules passed through.

    The sandbox re-imports every module that is not passed through for each new workflow
    run; for a thousand resize workflows that import cost was a fifth of the worker's CPU.
    Our `workflows` package is deterministic by construction (pure code, no I/O, no
    module state that changes: see docs/architecture.md), so sharing it is safe; the sandbox still
    guards everything else."""
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules("workflows")
    )


def discovery_id(settings: Settings) -> str:
    return f"discovery/{settings.task_queue}"


def build_worker(
    client: Client, settings: Settings, kube: Kube
) -> tuple[Worker, ClusterActivities]:
    ray = RaySettings(
        gcs_override=settings.gcs_address,
        token=resolve_token(settings.ray_token),
        tls=TlsConfig.from_env(),
    )
    cluster = ClusterActivities(kube=kube, ray=ray, settings=settings.planner())
    discovery = DiscoveryActivities(
        kube=kube,
        temporal=client,
        task_queue=settings.task_queue,
        start_input=reconcile_input(settings),
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
        max_concurrent_workflow_task_polls=10,
        max_concurrent_activity_task_polls=10,
        graceful_shutdown_timeout=timedelta(seconds=10),
    )
    return worker, cluster


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


async def _serve(
    settings: Settings, telemetry: Telemetry, *, stop: asyncio.Event | None = None
) -> None:
    try:  # before Temporal: a bad kubeconfig is the commoner mistake, and the cheaper check
        kube = Kube.from_kubeconfig(str(settings.kubeconfig) if settings.kubeconfig else None)
    except KubeconfigError as exc:
        raise SetupError(str(exc)) from None
    client = await connect(settings, telemetry)
    log.info(
        "telemetry: traces %s, metrics %s",
        "over OTLP" if telemetry.tracer_provider else "off",
        telemetry.metrics_export,
    )
    added = await ensure_search_attributes(client, register=settings.register_search_attributes)
    if added:
        log.info("registered search attributes: %s", ", ".join(added))
    worker, cluster = build_worker(client, settings, kube)
    if settings.discover:
        await client.start_workflow(
            DiscoveryWorkflow.run,
            DiscoveryInput(
                namespaces=tuple(settings.namespace_list()),
                interval_s=settings.discovery_interval_s,
            ),
            id=discovery_id(settings),
            task_queue=settings.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
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
    try:
        async with worker:
            await stop.wait()
            log.info("shutting down: finishing running activities (up to 10 s)")
    finally:
        cluster.close()
