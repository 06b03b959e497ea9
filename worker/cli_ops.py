"""Operator commands: run the worker, and thin clients over the workflows' signals and
queries (each has a `temporal workflow ...` equivalent, shown in the README)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Annotated, TypeVar

import typer
from pydantic import ValidationError
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from raysize.worker.cli_common import OPS_PANEL
from raysize.worker.settings import Settings, check_log_level
from raysize.worker.status_view import ResizeRow, in_force_text, render_rows, resize_rows
from raysize.worker.temporal import SetupError, connect
from raysize.workflows.contracts import ReconcileStatus
from raysize.workflows.naming import RESIZE_OUTCOME, reconcile_workflow_id, resize_workflow_id
from raysize.workflows.reconcile_workflow import ReconcileWorkflow
from raysize.workflows.resources import CPU, units_to_float

T = TypeVar("T")


def _fail(message: str) -> typer.Exit:
    sys.stderr.write(f"error: {message}\n")
    return typer.Exit(code=1)


def _settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        message = str(first["msg"]).removeprefix("Value error, ")
        if not first["loc"]:  # a rule across settings: its message names them
            raise _fail(message) from None
        raise _fail(f"RAYSIZE_{str(first['loc'][0]).upper()}: {message}") from None


def _split(ref: str, what: str) -> tuple[str, str]:
    parts = ref.split("/")
    if len(parts) != 2 or not all(parts):
        raise _fail(f"{ref!r} is not <namespace>/<{what}>; e.g. default/raycluster-demo")
    return parts[0], parts[1]


def _run(fn: Callable[[Client], Awaitable[T]]) -> T:
    async def go() -> T:
        client = await connect(_settings())
        return await fn(client)

    try:
        return asyncio.run(go())
    except SetupError as exc:
        raise _fail(str(exc)) from None
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise _fail(f"no such workflow: {exc.message}") from None
        if exc.status == RPCStatusCode.DEADLINE_EXCEEDED or "Timeout expired" in exc.message:
            queue = _settings().task_queue
            raise _fail(
                f"no answer in {QUERY_TIMEOUT.total_seconds():g}s: a query is answered by a "
                f"raysize worker, and none is polling task queue {queue!r} (start "
                "`raysize worker`, or set RAYSIZE_TASK_QUEUE to the worker's queue)"
            ) from None
        raise _fail(f"Temporal refused: {exc.message}") from None


def _cores(units: int) -> str:
    return f"{units_to_float(units, CPU):g}"


IO_THREADS = 64
# a query waits for a worker to answer it: bounded, so `raysize status` never hangs
QUERY_TIMEOUT = timedelta(seconds=10)


def register(app: typer.Typer) -> None:
    @app.command("worker", rich_help_panel=OPS_PANEL)
    def worker_cmd(
        log_level: Annotated[
            str | None,
            typer.Option(help="DEBUG, INFO, WARNING or ERROR (default: RAYSIZE_LOG_LEVEL)"),
        ] = None,
        observe_only: Annotated[
            bool,
            typer.Option(
                "--observe-only",
                help="Plan and say what would be done, change nothing (RAYSIZE_OBSERVE_ONLY).",
            ),
        ] = False,
    ) -> None:
        """Run the raysize worker (settings: RAYSIZE_* variables, docs/configuration.md)."""
        from raysize.worker.run import run_worker, tune_gc
        from raysize.worker.telemetry import configure_logging

        settings = _settings()
        if observe_only:
            settings = settings.model_copy(update={"observe_only": True})
        level = settings.log_level
        if log_level is not None:
            try:
                level = check_log_level(log_level)
            except ValueError as exc:
                raise _fail(f"--log-level {exc}") from None
        configure_logging(level, settings.log_format)
        tune_gc()  # every module is imported by now

        async def serve() -> None:
            # activities block in threads (Kubernetes and GCS calls); Python's default pool
            # has cpu+4 threads, which a few slow API calls would fill, holding up the rest
            asyncio.get_running_loop().set_default_executor(
                ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="raysize-io")
            )
            await run_worker(settings)

        try:
            asyncio.run(serve())
        except SetupError as exc:
            if settings.log_format != "json":
                raise _fail(str(exc)) from None
            # with RAYSIZE_LOG_FORMAT=json every line the worker writes is JSON, its last
            # one too: a log collector parses it, and would file a plain line as noise
            logging.getLogger("raysize.worker").critical("%s", exc)
            raise typer.Exit(code=1) from None
        except Exception:
            if settings.log_format != "json":
                raise
            # a bug: its traceback, in one JSON line (`exc`), not over many plain ones
            logging.getLogger("raysize.worker").critical("the worker failed", exc_info=True)
            raise typer.Exit(code=1) from None

    @app.command("start", rich_help_panel=OPS_PANEL)
    def start_cmd(
        cluster: Annotated[str, typer.Argument(help="<namespace>/<raycluster>")],
    ) -> None:
        """Start managing a RayCluster now (the worker's discovery does this by itself)."""
        ns, name = _split(cluster, "raycluster")
        from raysize.activities.discovery import start_reconciler
        from raysize.worker.run import reconcile_input

        async def go(client: Client) -> str:
            settings = _settings()
            inp = reconcile_input(settings)(ns, name)
            return (await start_reconciler(client, inp, settings.task_queue)).id

        typer.echo(f"managing {cluster}: workflow {_run(go)}")

    @app.command("stop", rich_help_panel=OPS_PANEL)
    def stop_cmd(cluster: Annotated[str, typer.Argument(help="<namespace>/<raycluster>")]) -> None:
        """Stop managing a RayCluster until `raysize start` (running resizes finish on
        their own; discovery leaves a stopped cluster alone)."""
        ns, name = _split(cluster, "raycluster")

        async def go(client: Client) -> None:
            kube = _settings().cluster_name
            await client.get_workflow_handle(reconcile_workflow_id(ns, name, kube)).cancel()

        _run(go)
        typer.echo(f"stopped managing {cluster}")

    @app.command("status", rich_help_panel=OPS_PANEL)
    def status_cmd(
        cluster: Annotated[str, typer.Argument(help="<namespace>/<raycluster>")],
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
        show_all: Annotated[
            bool,
            typer.Option(
                "--all", help="Also the resizes of pods the cluster no longer has (newest 200)."
            ),
        ] = False,
    ) -> None:
        """What raysize decided for a RayCluster (its last decisions, and what its last plan
        left waiting and why), and its resizes: pod, from → to, phase, outcome and age,
        newest first (only the cluster's live pods unless --all)."""
        ns, name = _split(cluster, "raycluster")

        async def go(client: Client) -> tuple[ReconcileStatus, list[ResizeRow], int]:
            kube = _settings().cluster_name
            status = await client.get_workflow_handle_for(
                ReconcileWorkflow.run, reconcile_workflow_id(ns, name, kube)
            ).query(ReconcileWorkflow.status, rpc_timeout=QUERY_TIMEOUT)
            live = None if show_all or status.pods is None else set(status.pods)
            rows, hidden = await resize_rows(
                client, ns, name, datetime.now(UTC), live, kube_cluster=kube
            )
            return status, rows, hidden

        status, rows, hidden = _run(go)
        if as_json:
            doc = {
                "status": status.model_dump(mode="json"),
                "resizes": [r.to_json() for r in rows],
                "hidden": hidden,
            }
            typer.echo(json.dumps(doc, indent=2))
            return
        s = status
        state = "PAUSED" if s.paused else "standing by" if s.stood_down else "active"
        if s.observe_only:
            state += ", observe-only (RAYSIZE_OBSERVE_ONLY: nothing is changed)"
        typer.echo(f"{cluster}: {state}, {s.ticks} ticks, {s.resizes_started} resizes started")
        if s.in_force is not None:
            typer.echo(f"  in force: {in_force_text(s.in_force)}")
        if s.stood_down and s.ray_autoscaler_pod:
            typer.echo(
                f"  Ray's autoscaler still runs in head pod {s.ray_autoscaler_pod} (container "
                "autoscaler), though spec.enableInTreeAutoscaling is false: restart the head "
                "pod or stop that container, and raysize takes over"
            )
        elif s.stood_down:
            typer.echo(
                "  Ray's in-tree autoscaler owns this cluster (spec.enableInTreeAutoscaling: "
                "true): raysize takes no action until it is set to false"
            )
        for err in s.config_errors:
            typer.echo(f"  config error: {err}")
        if s.last_error:
            typer.echo(f"  last error: {s.last_error}")
        for d in s.decisions[-10:]:
            typer.echo(f"  {d.summary}")
        for line in s.would:  # observe-only: the plan it did not carry out, all of it
            typer.echo(f"  now {line}")
        # what the last plan left waiting, and why (a hold, demand no group can host)
        for note in s.last_plan.notes if s.last_plan is not None else ():
            typer.echo(f"  last plan: {note}")
        if rows:
            typer.echo("resizes (newest first):")
            for line in render_rows(rows):
                typer.echo(line)
        if hidden:
            typer.echo(f"  … and {hidden} of pods the cluster no longer has (--all shows them)")

    def _signal(ref: str, pod: str | None, name: str) -> None:
        ns, cluster_name = _split(ref, "raycluster")

        async def go(client: Client) -> str:
            kube = _settings().cluster_name
            wf_id = (
                resize_workflow_id(ns, pod, kube)
                if pod
                else reconcile_workflow_id(ns, cluster_name, kube)
            )
            await client.get_workflow_handle(wf_id).signal(name)
            return wf_id

        typer.echo(f"{name}d {_run(go)}")

    @app.command("pause", rich_help_panel=OPS_PANEL)
    def pause_cmd(
        cluster: Annotated[str, typer.Argument(help="<namespace>/<raycluster>")],
        pod: Annotated[str | None, typer.Option(help="Pause this pod's resize instead.")] = None,
    ) -> None:
        """Hold a cluster's reconcile (or one pod's resize) before its next action."""
        _signal(cluster, pod, "pause")

    @app.command("resume", rich_help_panel=OPS_PANEL)
    def resume_cmd(
        cluster: Annotated[str, typer.Argument(help="<namespace>/<raycluster>")],
        pod: Annotated[str | None, typer.Option(help="Resume this pod's resize instead.")] = None,
    ) -> None:
        """Let a paused reconcile (or resize) go on."""
        _signal(cluster, pod, "resume")

    @app.command("cancel", rich_help_panel=OPS_PANEL)
    def cancel_cmd(
        cluster: Annotated[str, typer.Argument(help="<namespace>/<raycluster>")],
        pod: Annotated[
            str | None, typer.Option(help="The pod whose resize to cancel (required).")
        ] = None,
    ) -> None:
        """Cancel a pod's running resize: it is rolled back to where it started (a resize
        that has ended is left alone, with an error saying how it ended)."""
        ns, _ = _split(cluster, "raycluster")
        if not pod:
            raise _fail(
                "cancel needs the pod: raysize cancel <namespace>/<raycluster> --pod <pod> "
                "(the same target as pause and resume)"
            )
        name = pod

        async def go(client: Client) -> str:
            wf_id = resize_workflow_id(ns, name, _settings().cluster_name)
            # a cancel of a resize that has ended is accepted and does nothing: look first
            try:
                desc = await client.get_workflow_handle(wf_id).describe()
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
                raise _fail(
                    f"no resize of pod {ns}/{name} to cancel (no workflow {wf_id}): check the "
                    f"pod's name and namespace (`raysize status {cluster}` shows the "
                    "cluster's resizes)"
                ) from None
            if desc.status != WorkflowExecutionStatus.RUNNING:
                ended = desc.status.name if desc.status is not None else "UNKNOWN"
                outcome = desc.typed_search_attributes.get(RESIZE_OUTCOME)
                raise _fail(
                    f"the resize of pod {ns}/{name} (workflow {wf_id}) is not running: it "
                    f"ended {ended}{f', outcome {outcome}' if outcome else ''}. Nothing to "
                    "cancel: the pod keeps the size that resize left it at (`raysize status "
                    f"{cluster}` shows its resizes)"
                )
            # this run, not one started after the look
            await client.get_workflow_handle(wf_id, run_id=desc.run_id).cancel()
            return wf_id

        typer.echo(f"cancel requested: {_run(go)} rolls the pod back, then ends CANCELED")
