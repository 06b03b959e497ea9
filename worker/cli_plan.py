"""`raysize plan`: run the planner on a scheduling scenario (bench/SCENARIO.md format)."""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from worker.cli_common import DEV_PANEL
from workflows.model import Plan, ResizePolicy, UpscalingMode
from workflows.planner import plan
from workflows.resources import CPU, MEMORY, Resources, units_to_float
from workflows.scenario import ScenarioError, load_scenario, parse_scenario_json, plan_to_json


def _read(path: Path) -> object:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ScenarioError(
            f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8 JSON"
        ) from exc
    try:
        return parse_scenario_json(text)
    except ScenarioError as exc:  # a key given twice
        raise ScenarioError(f"{path}: {exc}") from exc
    except RecursionError as exc:
        raise ScenarioError(
            f"{path} nests too deeply to be a scenario (bench/SCENARIO.md is at most a few "
            "levels deep)"
        ) from exc
    except json.JSONDecodeError as exc:
        raise ScenarioError(
            f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc


def _explain(p: Plan, console: Console) -> None:
    table = Table(title="raysize plan", show_lines=False)
    table.add_column("action")
    table.add_column("target")
    table.add_column("size")
    table.add_column("why")
    for launch in p.launch:
        table.add_row("launch", f"{launch.count} × {launch.group}", "", launch.reason)
    for r in p.resize:
        size = (
            f"{units_to_float(r.from_cpu, CPU):g} → {units_to_float(r.cpu, CPU):g} CPU, "
            f"{Resources({MEMORY: r.from_memory}).to_k8s().get('memory', '0')} → "
            f"{Resources({MEMORY: r.memory}).to_k8s().get('memory', '0')}"
        )
        table.add_row("shrink" if r.shrinks else "grow", r.pod, size, r.reason)
    for t in p.terminate:
        table.add_row("remove", t.pod, "", t.reason)
    if not (p.launch or p.resize or p.terminate):
        table.add_row("none", "", "", "nothing to do")
    console.print(table)
    inf = p.infeasible
    console.print(
        f"unplaced: {inf.demands} demand unit(s), {inf.gangs} placement group(s), "
        f"{inf.constraints} requested bundle(s)"
    )
    for note in p.notes:
        console.print(f"  - {note}")


def register(app: typer.Typer) -> None:
    @app.command("plan", rich_help_panel=DEV_PANEL)
    def plan_cmd(
        scenario: Annotated[
            Path, typer.Option("--scenario", "-s", help="Scenario JSON (bench/SCENARIO.md v1).")
        ],
        explain: Annotated[
            bool, typer.Option("--explain", help="Print a readable table with every reason.")
        ] = False,
        repeat: Annotated[
            int, typer.Option("--repeat", min=1, help="Plan this many times (with --timing).")
        ] = 1,
        timing: Annotated[
            bool,
            typer.Option(
                "--timing", help="Print plan_seconds=<median> on stderr (parsing excluded)."
            ),
        ] = False,
        resize_policy: Annotated[
            ResizePolicy | None,
            typer.Option(
                "--resize-policy",
                help="right-size: smallest step-rounded size that fits; max: one step to max.",
            ),
        ] = None,
        upscaling_mode: Annotated[
            UpscalingMode | None,
            typer.Option("--upscaling-mode", help="KubeRay upscaling mode."),
        ] = None,
    ) -> None:
        """Plan one reconcile tick from a scenario file and print the plan as JSON."""
        try:
            doc = _read(scenario)
        except ScenarioError as exc:
            sys.stderr.write(f"error: {exc}\n")
            raise typer.Exit(code=2) from None
        try:
            snap = load_scenario(doc)
        except ScenarioError as exc:
            sys.stderr.write(f"error: {scenario}: {exc}\n")
            raise typer.Exit(code=2) from None
        updates: dict[str, object] = {}
        if resize_policy is not None:
            updates["resize_policy"] = resize_policy
        if upscaling_mode is not None:
            updates["upscaling_mode"] = upscaling_mode
        if updates:
            snap = snap.model_copy(update={"settings": snap.settings.model_copy(update=updates)})
        samples: list[float] = []
        result: Plan | None = None
        for i in range(repeat):
            if i:
                snap = load_scenario(doc, snap.settings)  # fresh input, not timed
            t0 = time.perf_counter()
            result = plan(snap)
            samples.append(time.perf_counter() - t0)
        assert result is not None
        if explain:
            _explain(result, Console())
        else:
            sys.stdout.write(json.dumps(plan_to_json(result), indent=2) + "\n")
        if timing:
            sys.stderr.write(f"plan_seconds={statistics.median(samples):.6f}\n")
