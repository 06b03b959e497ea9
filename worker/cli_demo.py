"""`raysize demo`: the whole product on this machine, no cluster needed."""

from __future__ import annotations

from typing import Annotated

import typer

from raysize.worker.cli_common import DEV_PANEL, before_exit, stand_ins, usage_error

# the stories by name, for --help without loading the demo (and the sandbox it builds on):
# tests/demo checks these against worker/demo_scenarios.py's SCENARIOS
STORIES = {
    "grow": "a 1-CPU worker grows in place to 2 CPU for a 2-CPU task, then to 4 CPU for a "
    "placement group of two 2-CPU bundles: no pod is launched",
    "timeout": "the first worker's node never actuates a resize: timeout, rollback; a "
    "second pod is launched instead, at the task's size",
    "deferred": "the node is too full for the right size: raysize reads the node's room and "
    "grows the pod to what fits (2.5 CPU, not the 3 right-sizing asks), never deferred",
    "idle": "a worker grows for a task, then shrinks back to its template size when idle",
}
_SCENARIO_HELP = "; ".join(f"{name}: {title}" for name, title in STORIES.items())


DEMO_HELP = "\n\n".join(
    [
        "Run raysize end to end on this machine, no cluster needed.",
        "Starts a Temporal dev server (with its web UI and raysize's search attributes), the "
        "sandbox (a local Kubernetes API, kubelet and KubeRay stand-in, with real Ray processes "
        "behind the Ray pods) and a raysize worker; creates the RayCluster default/demo with a "
        "ray.io/ippr annotation (1 worker of 1 CPU, growable to 4 in place); runs a Ray "
        "workload that needs more than that, and shows live what happens: Ray's pending "
        "demands, why each step happens (the reconcile's own decisions), each resize's sizes, "
        "phase and outcome, the pods with their Raylet totals, and the workload's progress, "
        "fitted to the terminal (80x24 and up). At the end: a summary and the Temporal UI "
        "link of each resize workflow.",
        "In the live view the demo then stays up (so the UI links work) and goes on showing "
        "the cluster (idle pods shrink back, then go) until Ctrl-C; with --headless or "
        "--no-stay the end of the story stops it. Either way every process the demo started "
        "is stopped, each by its own process group.",
        "Exit codes: 0 the story reached its expected end; 1 it did not, or something failed "
        "(the logs are kept and their directory printed); 2 bad options, a busy port or a "
        "missing dependency (install with: pip install -e '.\\[demo]'); 130 interrupted.",
    ]
)


def _port(value: int, flag: str) -> int:
    if not 1 <= value <= 65535:
        raise usage_error(f"{flag} {value}: expected a port number 1..65535")
    return value


def register(app: typer.Typer) -> None:
    @app.command("demo", help=DEMO_HELP, rich_help_panel=DEV_PANEL)
    def demo_cmd(
        scenario: Annotated[
            str,
            typer.Option(
                "--scenario", help=f"which story to tell (default grow). {_SCENARIO_HELP}."
            ),
        ] = "grow",
        headless: Annotated[
            bool,
            typer.Option(
                "--headless",
                help="print one JSON object per line per change instead of the live view "
                "(for scripts and tests); the last line is the summary",
            ),
        ] = False,
        temporal_port: Annotated[
            int, typer.Option("--temporal-port", help="port of the Temporal dev server (gRPC)")
        ] = 7233,
        ui_port: Annotated[
            int, typer.Option("--ui-port", help="port of the Temporal web UI")
        ] = 8233,
        timeout: Annotated[
            float,
            typer.Option(
                "--timeout", help="seconds the story may take before the demo gives up (exit 1)"
            ),
        ] = 300.0,
        keep_logs: Annotated[
            bool,
            typer.Option(
                "--keep-logs",
                help="keep the temp dir with the dev server's, worker's and driver's logs "
                "(always kept when the story does not reach its end)",
            ),
        ] = False,
        stay: Annotated[
            bool | None,
            typer.Option(
                "--stay/--no-stay",
                help="after the story, keep the Temporal server (and the cluster) running so "
                "the UI links work, until Ctrl-C (default: stay in the live view, leave at "
                "once with --headless)",
            ),
        ] = None,
    ) -> None:
        """Run raysize end to end on this machine, no cluster needed (see --help)."""
        if scenario not in STORIES:
            raise usage_error(f"--scenario {scenario!r}: expected one of {', '.join(STORIES)}")
        _port(temporal_port, "--temporal-port")
        _port(ui_port, "--ui-port")
        if not timeout > 0:
            raise usage_error(f"--timeout {timeout:g}: expected a positive number of seconds")

        with stand_ins("demo"):
            from raysize.sandbox import reaper
            from raysize.worker.demo import DemoConfig, run_demo
            from raysize.worker.demo_scenarios import SCENARIOS
            from raysize.worker.demo_view import JsonSink, LiveSink, Sink
        # what a SIGKILL would leave is stopped by the reaper; at a normal exit, wait for it
        before_exit(reaper.close)

        sink: Sink = JsonSink() if headless else LiveSink()
        cfg = DemoConfig(
            scenario=SCENARIOS[scenario],
            temporal_port=temporal_port,
            ui_port=ui_port,
            timeout_s=timeout,
            keep_logs=keep_logs,
            stay=(not headless) if stay is None else stay,
        )
        raise typer.Exit(code=run_demo(cfg, sink))
