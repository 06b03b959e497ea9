"""`raysize plan`: run the planner on a scheduling scenario (bench/SCENARIO.md format)."""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperCommand

from raysize.worker.cli_common import DEV_PANEL
from raysize.worker.scenario import ScenarioError, load_scenario, parse_scenario_json, plan_to_json
from raysize.workflows.model import (
    ClusterSnapshot,
    GroupSpec,
    Plan,
    PodPhase,
    ResizePolicy,
    UpscalingMode,
)
from raysize.workflows.planner import (
    FREE_ROOM,
    GROWN,
    NEW_POD,
    PENDING_POD,
    Left,
    Trace,
    plan,
    plan_with_trace,
    selector_matches,
)
from raysize.workflows.resources import CPU, MEMORY, Resources, units_to_float


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


EXPLAIN_MODES = ("summary", "full")
TOP = 6  # shapes, groups or reasons listed by name in the summary; the rest are counted


def _cores(units: int) -> str:
    f = units_to_float(units, CPU)
    return f"{int(f) if f == int(f) else round(f, 3):,}"


def _mem(units: int) -> str:
    return Resources({MEMORY: units}).to_k8s().get("memory", "0")


def _n(x: int) -> str:
    return f"{x:,}"


def _listed(parts: list[str], total: int | None = None, noun: str = "more") -> str:
    """The first TOP parts, then how many more."""
    shown = ", ".join(parts[:TOP])
    more = (total if total is not None else len(parts)) - min(len(parts), TOP)
    return shown + (f" and {more} {noun}" if more > 0 else "")


def _selector(sel: object) -> str:
    items = sel.items() if isinstance(sel, dict) else sel
    text = ", ".join(f"{k}={v}" for k, v in items)  # type: ignore[attr-defined]
    return f" where {text}" if text else ""


def _why_left(snap: ClusterSnapshot, left: Left, p: Plan) -> str:
    """Why nothing can take these units: no group's pod is big enough, or the groups whose
    pod would be are at their maximum."""
    shape = left.shape
    fits = []
    for g in snap.groups.values():
        if g.is_head:
            continue
        cap = Resources(g.resources)
        if g.ippr is not None:
            cap = cap.with_amount(CPU, max(cap.cpu, g.ippr.max_cpu))
            cap = cap.with_amount(MEMORY, max(cap.memory, g.ippr.max_memory))
        if shape.fits(cap) and selector_matches(left.selector, g.labels):
            fits.append(g)
    if not fits:
        return "no group's pod can hold it, even grown to its IPPR maximum"
    at_max = []
    gone = {t.pod for t in p.terminate}
    for g in fits:
        count = sum(1 for x in snap.pods if x.group == g.name and x.name not in gone)
        count += p.launch_by_group.get(g.name, 0)
        if g.max_workers is not None and count >= g.max_workers:
            at_max.append(f"{g.name} is at max_workers={g.max_workers}")
    limit = snap.settings.max_workers
    if limit is not None:
        workers = sum(1 for x in snap.pods if not snap.groups[x.group].is_head)
        if workers + sum(p.launch_by_group.values()) - len(p.terminate) >= limit:
            at_max.append(f"the cluster is at max_workers={limit}")
    if at_max:
        fit_names = ", ".join(g.name for g in fits)
        return f"only {fit_names} can hold it, and " + "; ".join(at_max)
    return "the room that fits is taken, and no more pods may be launched this tick"


def _summary(snap: ClusterSnapshot, p: Plan, trace: Trace) -> list[str]:
    """A screenful for people: what waits, what the plan does and why, what stays."""
    out: list[str] = []
    pods = [
        x
        for x in snap.pods
        if not snap.groups.get(x.group, GroupSpec(name="?", resources=Resources())).is_head
    ]
    pending_pods = sum(1 for x in pods if x.phase == PodPhase.PENDING)
    workers = [g for g in snap.groups.values() if not g.is_head]
    out.append(
        f"raysize plan for {snap.name}: {_n(len(pods))} worker pod(s) ({_n(pending_pods)} "
        f"pending) in {len(workers)} group(s)"
    )
    # what waits
    out.append("")
    out.append("Pending")
    demands = Counter[str]()
    for d in snap.demands:
        if d in trace.in_groups:
            continue
        demands[d.shape.describe() + _selector(d.label_selector)] += d.count
    units = sum(demands.values())
    if units:
        parts = [f"{_n(n)} × {shape}" for shape, n in demands.most_common()]
        out.append(
            f"  {_n(units)} task/actor unit(s) in {len(demands)} shape(s): "
            + _listed(parts, noun="more shapes")
        )
    gangs = sum(g.count for g in snap.gangs)
    if gangs:
        kinds = Counter[str]()
        for g in snap.gangs:
            kinds[f"{g.strategy.value} of {len(g.bundles)}"] += g.count
        parts = [f"{n} × {k}" for k, n in kinds.most_common()]
        out.append(f"  {_n(gangs)} placement group(s): " + _listed(parts))
    bundles = sum(c.count for c in snap.constraints)
    if bundles:
        parts = [f"{_n(c.count)} × {c.shape.describe()}" for c in snap.constraints]
        out.append(f"  {_n(bundles)} requested bundle(s) (request_resources): " + _listed(parts))
    if trace.in_groups:
        n = sum(d.count for d in trace.in_groups)
        out.append(
            f"  {_n(n)} unit(s) wait inside their placement group (resources named "
            "<name>_group_<id>): the group's bundles hold their room, so the plan leaves "
            "them to it, as Ray's autoscaler does"
        )
    if not (units or gangs or bundles or trace.in_groups):
        out.append("  nothing")
    # where the work goes
    out.append("")
    out.append("The plan")
    where = Counter[str]()
    requested = 0
    for pl in trace.placements:
        if pl.kind == "requested":
            requested += pl.count
        else:
            where[pl.where] += pl.count
    if where:
        text = {
            FREE_ROOM: "on free room",
            GROWN: "on pods grown in place",
            PENDING_POD: "on pods already starting",
            NEW_POD: "on new pods",
        }
        out.append(
            "  places "
            + ", ".join(
                f"{_n(where[w])} {text[w]}"
                for w in (FREE_ROOM, GROWN, PENDING_POD, NEW_POD)
                if where[w]
            )
            + " (tasks/actors and placement-group bundles)"
        )
    if requested:
        out.append(f"  counts {_n(requested)} requested bundle(s) on the capacity of pods")
    if p.launch:
        total = sum(a.count for a in p.launch)
        groups = ", ".join(f"{a.group} {_n(a.count)}" for a in p.launch)
        on_new = Counter[str]()
        for pl in trace.placements:
            if pl.where == NEW_POD and pl.kind != "requested":
                on_new[pl.shape.describe()] += pl.count
        parts = [f"{_n(n)} × {shape}" for shape, n in on_new.most_common()]
        out.append(
            f"  launches {_n(total)} pod(s) ({groups}): no existing pod has room, even grown, "
            f"for {_n(sum(on_new.values()))} unit(s): " + _listed(parts, noun="more shapes")
        )
    grows = [r for r in p.resize if not r.shrinks]
    shrinks = [r for r in p.resize if r.shrinks]
    if grows:
        cpu = sum(r.cpu - r.from_cpu for r in grows)
        mem = sum(r.memory - r.from_memory for r in grows)
        by_group = Counter(r.group for r in grows)
        retargets = sum(1 for r in grows if r.retarget)
        line = (
            f"  grows {_n(len(grows))} pod(s) in place (+{_cores(cpu)} CPU"
            + (f", +{_mem(mem)} memory" if mem else "")
            + "): "
            + ", ".join(f"{g} {n}" for g, n in by_group.most_common())
            + "; cheaper than new pods, within each group's IPPR maximum"
        )
        out.append(line)
        if retargets:
            out.append(
                f"    {retargets} of them take{'s' if retargets == 1 else ''} a grow already "
                "in flight further (retarget)"
            )
    if shrinks:
        out.append(f"  shrinks {_n(len(shrinks))} idle pod(s) back to their group's size")
    if p.terminate:
        why = Counter(
            "idle past idle_timeout_s" if t.reason.startswith("idle ") else t.reason
            for t in p.terminate
        )
        parts = [f"{n} × {r}" if n > 1 else r for r, n in why.most_common()]
        out.append(
            f"  removes {_n(len(p.terminate))} pod(s): " + _listed(parts, noun="more reasons")
        )
    if not (p.launch or p.resize or p.terminate):
        out.append("  nothing to do: what waits fits the room there is")
    # what stays
    out.append("")
    out.append("Left waiting")
    if not trace.left:
        out.append("  nothing")
    for left in trace.left:
        if left.kind == "placement group":
            what = (
                f"{_n(left.count)} {left.strategy} placement group(s) of {left.bundles} "
                f"bundle(s), {left.shape.describe()} in all"
            )
        else:
            noun = "requested bundle(s)" if left.kind == "requested" else "task/actor unit(s)"
            what = f"{_n(left.count)} {noun} {left.shape.describe()}{_selector(left.selector)}"
        out.append(f"  {what}: {_why_left(snap, left, p)}")
    out.append("")
    out.append("--explain=full lists every action and where each unit goes.")
    return out


def _explain_full(snap: ClusterSnapshot, p: Plan, trace: Trace, console: Console) -> None:
    for line in _summary(snap, p, trace)[:-1]:
        console.print(line, highlight=False, markup=False)
    table = Table(title="actions", show_lines=False)
    table.add_column("action")
    table.add_column("target")
    table.add_column("size")
    table.add_column("why")
    for launch in p.launch:
        table.add_row("launch", f"{launch.count} × {launch.group}", "", launch.reason)
    for r in p.resize:
        size = (
            f"{units_to_float(r.from_cpu, CPU):g} → {units_to_float(r.cpu, CPU):g} CPU, "
            f"{_mem(r.from_memory)} → {_mem(r.memory)}"
        )
        action = "shrink" if r.shrinks else "retarget" if r.retarget else "grow"
        table.add_row(action, r.pod, size, r.reason)
    for t in p.terminate:
        table.add_row("remove", t.pod, "", t.reason)
    if not (p.launch or p.resize or p.terminate):
        table.add_row("none", "", "", "nothing to do")
    console.print(table)
    placed = Table(title="where each unit goes", show_lines=False)
    placed.add_column("pod")
    placed.add_column("group")
    placed.add_column("how")
    placed.add_column("what")
    for pl in trace.placements:
        placed.add_row(
            pl.pod, pl.group, pl.where, f"{_n(pl.count)} × {pl.shape.describe()} {pl.kind}"
        )
    console.print(placed)
    inf = p.infeasible
    console.print(
        f"unplaced: {inf.demands} demand unit(s), {inf.gangs} placement group(s), "
        f"{inf.constraints} requested bundle(s)",
        highlight=False,
    )
    for note in p.notes:
        console.print(f"  - {note}", highlight=False, markup=False)


class _PlanCommand(TyperCommand):
    """`--explain` may stand alone (the summary) or take a value (`--explain=full`):
    Typer has no option with an optional value, so a bare one is given its default here."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
        out = list(args)
        for i, arg in enumerate(out):
            if arg == "--":
                break
            if arg == "--explain" and (i + 1 == len(out) or out[i + 1].startswith("-")):
                out[i] = "--explain=summary"
        return super().parse_args(ctx, out)


def register(app: typer.Typer) -> None:
    @app.command("plan", cls=_PlanCommand, rich_help_panel=DEV_PANEL)
    def plan_cmd(
        scenario: Annotated[
            Path, typer.Option("--scenario", "-s", help="Scenario JSON (bench/SCENARIO.md v1).")
        ],
        explain: Annotated[
            str | None,
            typer.Option(
                "--explain",
                metavar="[summary|full]",
                help="Explain the plan for people instead of JSON: a one-screen summary "
                "(--explain), or every action and where each unit goes (--explain=full).",
            ),
        ] = None,
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
        if explain is not None and explain not in EXPLAIN_MODES:
            sys.stderr.write(
                f"error: --explain={explain}: expected --explain (a summary) or --explain=full\n"
            )
            raise typer.Exit(code=2)
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
        if explain is not None:
            result, trace = plan_with_trace(snap)
            console = Console()
            if explain == "full":
                _explain_full(snap, result, trace, console)
            else:
                for line in _summary(snap, result, trace):
                    console.print(line, highlight=False, markup=False, soft_wrap=True)
        else:
            sys.stdout.write(json.dumps(plan_to_json(result), indent=2) + "\n")
        if timing:
            sys.stderr.write(f"plan_seconds={statistics.median(samples):.6f}\n")
