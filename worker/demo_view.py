"""What `raysize demo` shows: the state it polls, as JSON lines (`--headless`) or a live
terminal view (rich), and the summary at the end."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO
from urllib.parse import quote

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from raysize.worker.demo_scenarios import CLUSTER, NAMESPACE, ResizeView, Scenario
from raysize.workflows.resources import CPU, MEMORY, units_to_float, units_to_quantity

MIB = 1024**2
NS_CLUSTER = f"{NAMESPACE}/{CLUSTER}"


@dataclass(frozen=True)
class PodRow:
    name: str
    role: str  # head | worker | other
    phase: str
    node: str
    cpu: str  # the spec (desired), a quantity
    memory: str
    cpu_now: str  # status.containerStatuses[].resources: what runs
    memory_now: str
    resize: str  # PodResizePending/InProgress reason, "" when none


@dataclass(frozen=True)
class RayletRow:
    node_id: str
    pod: str
    status: str
    cpu_total: float
    cpu_available: float
    memory_total_gib: float


@dataclass(frozen=True)
class Reason:
    """One line of a reconcile decision (`Decision.reasons`), as the planner wrote it."""

    tick: int
    text: str
    at_s: float  # seconds into the demo when it was first seen


@dataclass
class DemoState:
    scenario: Scenario
    ui_port: int
    started: float = field(default_factory=time.monotonic)
    pods: dict[str, PodRow] = field(default_factory=dict)
    raylets: dict[str, RayletRow] = field(default_factory=dict)
    demands: tuple[str, ...] = ()
    resizes: dict[tuple[str, str], ResizeView] = field(default_factory=dict)
    workload: list[str] = field(default_factory=list)
    workload_rc: int | None = None
    stage: str = "starting"
    reasons: list[Reason] = field(default_factory=list)
    plan_notes: tuple[str, ...] = ()  # why the last plan left some demand unserved
    ended: tuple[bool, int] | None = None  # (reached its end, after how many seconds)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def pod_of_node(self, node_id: str) -> str:
        row = self.raylets.get(node_id)
        return row.pod if row and row.pod else node_id[:12]


def ui_link(ui_port: int, workflow_id: str, run_id: str = "") -> str:
    base = f"http://localhost:{ui_port}/namespaces/default/workflows/{quote(workflow_id, safe='')}"
    return f"{base}/{run_id}/history" if run_id else base


def cores(units: int) -> str:
    return f"{units_to_float(units, CPU):g}"


def memory_text(units: int) -> str:
    return units_to_quantity(units, MEMORY)


def resize_text(r: ResizeView) -> str:
    return f"{cores(r.from_cpu)} → {cores(r.cpu)} CPU"


def summary(state: DemoState, ok: bool, missing: list[str]) -> dict[str, Any]:
    resizes = sorted(state.resizes.values(), key=lambda r: (r.workflow_id, r.run_id))
    grew = [r for r in resizes if r.outcome == "Succeeded" and r.cpu > r.from_cpu]
    shrank = [r for r in resizes if r.outcome == "Succeeded" and r.cpu < r.from_cpu]
    rolled_back = [r for r in resizes if r.outcome == "RolledBack"]
    workers = sorted(n for n, p in state.pods.items() if p.role == "worker")
    return {
        "event": "summary",
        "scenario": state.scenario.name,
        "ok": ok,
        "expected": state.scenario.expect,
        "missing": missing,
        "seconds": round(state.elapsed(), 1),
        "grew": [f"{r.pod}: {resize_text(r)}" for r in grew],
        "shrank": [f"{r.pod}: {resize_text(r)}" for r in shrank],
        "rolled_back": [
            f"{r.pod}: back to {cores(r.from_cpu)} CPU ({r.detail})" for r in rolled_back
        ],
        "worker_pods": workers,
        "workload_rc": state.workload_rc,
        "resizes": [
            {
                "workflow_id": r.workflow_id,
                "run_id": r.run_id,
                "pod": r.pod,
                "outcome": r.outcome,
                "from_cpu": cores(r.from_cpu),
                "cpu": cores(r.cpu),
                "attempts": list(r.attempts),
                "ui_link": ui_link(state.ui_port, r.workflow_id, r.run_id),
            }
            for r in resizes
        ],
        "ui_links": [ui_link(state.ui_port, r.workflow_id, r.run_id) for r in resizes],
    }


class Sink(Protocol):
    def event(self, doc: dict[str, Any]) -> None: ...

    def refresh(self, state: DemoState) -> None: ...

    def close(self) -> None: ...


class JsonSink:
    """`--headless`: one JSON object per line per change."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout

    def event(self, doc: dict[str, Any]) -> None:
        self.out.write(json.dumps(doc, sort_keys=False) + "\n")
        self.out.flush()

    def refresh(self, state: DemoState) -> None:
        return None

    def close(self) -> None:
        return None


class LiveSink:
    """The live terminal view, redrawn by every poll (about 4 times a second) to fit the
    terminal (see `DemoView`). The summary is printed above it when the story ends; the
    view then goes on following the cluster until Ctrl-C."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self.notes: list[str] = []
        self._live: Live | None = None
        self._last: DemoState | None = None
        self._closed = False

    def _print(self, renderable: RenderableType, **kwargs: Any) -> None:
        # while the live view runs, rich prints above it (into the scrollback)
        console = self._live.console if self._live is not None else self.console
        console.print(renderable, **kwargs)

    def event(self, doc: dict[str, Any]) -> None:
        kind = doc.get("event")
        if kind == "summary":
            self._print(render_summary(doc))
            if doc["resizes"]:
                self._print("Resize workflows in the Temporal UI:")
                for r in doc["resizes"]:
                    # one line each, never wrapped, so a terminal can open it
                    self._print(
                        f"  {r['outcome']:<10} {r['pod']}  {r['ui_link']}",
                        markup=False,
                        highlight=False,
                        soft_wrap=True,
                    )
            return
        if kind == "error":
            self.close()
        if self._closed:  # after the live view: plain lines
            if kind == "error":
                self.console.print(f"[red]error:[/red] {escape(str(doc.get('message', '')))}")
            elif kind in ("stopping", "interrupted", "staying"):
                self.console.print(str(doc.get("message", "")), markup=False)
            elif kind == "stopped" and not doc.get("problems"):
                self.console.print("stopped: nothing the demo started is left running")
            elif kind == "stopped" and doc.get("problems"):
                self.console.print(f"[red]not stopped cleanly:[/red] {doc['problems']}")
            elif kind == "logs":
                self.console.print(f"logs: {doc['workdir']}")
            return
        if kind in ("stage", "started"):
            self.notes.append(str(doc.get("message", "")))
        elif kind == "resize" and doc.get("closed"):
            to = doc["cpu"]
            if doc["outcome"] == "RolledBack" and doc.get("attempt_cpus"):
                to = doc["attempt_cpus"][-1]  # the state is back at the start: say what failed
            self.notes.append(
                f"resize of {doc['pod']} {doc['from_cpu']} → {to} CPU: {doc['outcome']}"
            )
        self.notes = self.notes[-NOTES_KEPT:]
        if self._last is not None:
            self.refresh(self._last)

    def refresh(self, state: DemoState) -> None:
        self._last = state
        if self._closed:
            return
        view = DemoView(state, list(self.notes))
        if self._live is None:
            self._live = Live(
                view,
                console=self.console,
                auto_refresh=False,
                transient=False,
                vertical_overflow="crop",
            )
            self._live.start()
        self._live.update(view, refresh=True)

    def close(self) -> None:
        self._closed = True
        if self._live is not None:
            self._live.stop()
            self._live = None


NOTES_KEPT = 6
GAP = 2  # spaces between columns

OUTCOME_STYLE = {"Succeeded": "green", "RolledBack": "red", "Canceled": "red", "Pending": "yellow"}


# --- fitting the terminal -------------------------------------------------------------------
@dataclass
class Column:
    """One column of a compact table. `drop`: higher goes first when the table is too wide
    (0: never); `shrink`: the column may be cut short with an ellipsis before any is
    dropped (only for columns whose end matters least)."""

    header: str
    cells: list[Text]
    drop: int = 0
    shrink: bool = False
    min_width: int = 10

    def natural(self) -> int:
        return max([len(self.header), *(c.cell_len for c in self.cells)])


def table_lines(columns: list[Column], width: int) -> list[Text]:
    """The header line and one line per row, at most `width` cells each: shrinkable
    columns give way first, then whole columns are dropped by `drop`, highest first."""
    cols = [c for c in columns]
    while True:
        widths = [c.natural() for c in cols]
        excess = sum(widths) + GAP * (len(cols) - 1) - width
        for i, c in enumerate(cols):
            if excess > 0 and c.shrink:
                cut = min(excess, widths[i] - min(c.min_width, widths[i]))
                widths[i] -= cut
                excess -= cut
        droppable = [c for c in cols if c.drop]
        if excess <= 0 or not droppable:
            break
        cols.remove(max(droppable, key=lambda c: c.drop))
    rows = max((len(c.cells) for c in cols), default=0)
    out = []
    for r in range(-1, rows):
        line = Text(no_wrap=True, overflow="ellipsis")
        for i, (c, w) in enumerate(zip(cols, widths, strict=True)):
            cell = Text(c.header, style="bold") if r < 0 else c.cells[r].copy()
            if cell.cell_len > w:
                cell.truncate(w, overflow="ellipsis")
            if i < len(cols) - 1:
                cell.pad_right(w - cell.cell_len + GAP)
            line.append_text(cell)
        line.truncate(width, overflow="ellipsis")
        out.append(line)
    return out


@dataclass
class Section:
    """A part of the view: `head` lines shown whenever the section is, then `items` (each
    one or more lines), of which the newest (last) are kept when room is short.
    Sections with a lower `priority` get room first; `min_items` is what a section needs
    to be shown at all."""

    priority: int
    head: list[Text]
    items: list[list[Text]]
    min_items: int = 1
    hidden: Callable[[int], Text] | None = None  # a line saying how many items are not shown

    def lines(self, n_items: int) -> list[Text]:
        kept = self.items[len(self.items) - n_items :] if n_items else []
        left = len(self.items) - n_items
        more = [self.hidden(left)] if left and self.hidden is not None and n_items else []
        return [*self.head, *more, *(line for item in kept for line in item)]

    def height(self, n_items: int) -> int:
        return len(self.lines(n_items))


OPTIONAL = 6  # sections of this priority and above get only the room the others leave


def fit(sections: list[Section], height: int) -> list[Text]:
    """The sections' lines (in the given order) in at most `height` lines. By priority,
    each section first gets its minimum or is left out; then the room left is shared
    out one item (the newest not yet shown) per section per round, so no section takes
    it all. The optional sections (the log, the story's title) get what is left last."""
    shown: dict[int, int | None] = {i: None for i in range(len(sections))}
    used = 0
    by_priority = sorted(range(len(sections)), key=lambda i: sections[i].priority)
    for i in by_priority:
        s = sections[i]
        n = min(s.min_items, len(s.items))
        if s.priority < OPTIONAL and used + s.height(n) <= height:
            shown[i] = n
            used += s.height(n)
    for optional in (False, True):
        for i in by_priority:  # an optional section comes in once there is room for it
            s = sections[i]
            if optional and s.priority >= OPTIONAL and shown[i] is None:
                n = min(max(s.min_items, 1), len(s.items))
                if used + s.height(n) <= height:
                    shown[i] = n
                    used += s.height(n)
        growing = True
        while growing:
            growing = False
            for i in by_priority:
                got, s = shown[i], sections[i]
                if got is None or got >= len(s.items) or (s.priority >= OPTIONAL) != optional:
                    continue
                extra = s.height(got + 1) - s.height(got)
                if used + extra <= height:
                    shown[i] = got + 1
                    used += extra
                    growing = True
    return [
        line
        for i, s in enumerate(sections)
        if shown[i] is not None
        for line in s.lines(shown[i] or 0)
    ]


def _wrapped(console: Console, text: Text, width: int, indent: int = 2) -> list[Text]:
    """`text` wrapped to `width`, its continuation lines indented."""
    lines = list(text.wrap(console, max(width - indent, 10), overflow="fold"))
    return [lines[0], *(Text(" " * indent).append_text(line) for line in lines[1:])]


def _asked(r: ResizeView) -> str:
    """From → to; a rolled-back resize (whose state is back at its start) shows the size
    its last attempt asked for."""
    to = r.cpu
    if r.outcome == "RolledBack" and r.attempt_cpus:
        to = r.attempt_cpus[-1]
    return f"{cores(r.from_cpu)} → {cores(to)}"


def _change(now: str, want: str) -> str:
    return want if want == now or not now else f"{now} → {want}"


class DemoView:
    """The live view, laid out for the console it is drawn on. At 80×24 it keeps, in this
    order: the header, the resizes (pod, CPU, phase, outcome), why each step happens
    (the reconcile's decisions), Ray's pending demands, the pods, the workload and the
    log; narrower columns and older lines give way first."""

    def __init__(self, state: DemoState, notes: list[str]) -> None:
        self.state, self.notes = state, notes

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(options.max_width, 20)
        height = options.height or options.size.height
        yield from fit(self.sections(console, width), max(height, 1))

    def sections(self, console: Console, width: int) -> list[Section]:
        st, s = self.state, self.state.scenario
        if st.ended is None:
            status = Text.assemble((f"{st.elapsed():.0f}s ", "bold"), st.stage)
        else:
            ok, took = st.ended
            status = Text.assemble(
                ("done" if ok else "NOT DONE", "bold green" if ok else "bold red"),
                f" in {took}s; still following the cluster ({st.elapsed():.0f}s)",
            )
        title = Text.assemble(("raysize demo ", "bold"), (s.name, "bold cyan"), " · ")
        title.append_text(status)
        ui = Text.assemble(
            ("Temporal UI ", "dim"), f"http://localhost:{st.ui_port}", ("  Ctrl-C stops all", "dim")
        )
        header = Section(0, [*_wrapped(console, title, width), ui], [], min_items=0)
        story = Section(8, [], [_wrapped(console, Text(f"story: {s.title}", style="dim"), width)])

        demand_text = Text("Ray waits for: ", style="bold")
        demand_text.append(", ".join(st.demands) or "nothing", style="yellow" if st.demands else "")
        demands = Section(
            3,
            _wrapped(console, demand_text, width),
            [
                _wrapped(console, Text.assemble(("  unserved: ", "yellow"), note), width, 4)
                for note in st.plan_notes
            ],
            min_items=0,
        )

        why_items = [
            _wrapped(console, Text.assemble((f"{r.at_s:>4.0f}s ", "dim"), r.text), width, 6)
            for r in st.reasons
        ]
        why = Section(
            2,
            [Text("Why (the reconcile's decisions, newest last)", style="bold")],
            why_items or [[Text("  no decision yet", style="dim")]],
            hidden=lambda n: Text(f"  +{n} earlier: raysize status {NS_CLUSTER}", style="dim"),
        )

        resizes = sorted(st.resizes.values(), key=lambda v: (v.started, v.run_id))
        attempts = [
            "; ".join(
                f"{cores(c)}: {a}" if c else a
                for c, a in zip(r.attempt_cpus or (0,) * len(r.attempts), r.attempts, strict=False)
            )
            for r in resizes
        ]
        resize_lines = table_lines(
            [
                Column("Resizes", [Text(r.pod) for r in resizes]),
                Column("CPU", [Text(_asked(r)) for r in resizes]),
                Column("phase", [Text(r.phase or "-") for r in resizes]),
                Column(
                    "outcome",
                    [
                        Text(r.outcome or "-", style=OUTCOME_STYLE.get(r.outcome, ""))
                        for r in resizes
                    ],
                ),
                Column(
                    "attempts / detail",
                    [
                        Text(a or r.detail, style="dim")
                        for a, r in zip(attempts, resizes, strict=True)
                    ],
                    drop=1,
                    shrink=True,
                    min_width=16,
                ),
            ],
            width,
        )
        resize_section = Section(
            1,
            resize_lines[:1],
            [[line] for line in resize_lines[1:]] or [[Text("  none yet", style="dim")]],
            min_items=2,
            hidden=lambda n: Text(f"  +{n} earlier", style="dim"),
        )

        pods = sorted(st.pods.values(), key=lambda p: (p.role != "head", p.name))
        raylet = {r.pod: r for r in st.raylets.values()}

        def ray_cpu(p: PodRow) -> str:
            r = raylet.get(p.name)
            return f"{r.cpu_available:g}/{r.cpu_total:g}" if r else "-"

        pod_lines = table_lines(
            [
                Column("Pods", [Text(p.name) for p in pods]),
                Column("phase", [Text(p.phase) for p in pods], drop=3),
                Column("CPU", [Text(_change(p.cpu_now, p.cpu)) for p in pods]),
                Column("Ray free/total", [Text(ray_cpu(p)) for p in pods], drop=2),
                Column("resize", [Text(p.resize or "-") for p in pods], drop=4),
                Column("memory", [Text(_change(p.memory_now, p.memory)) for p in pods], drop=5),
                Column("node", [Text(p.node, style="dim") for p in pods], drop=6),
            ],
            width,
        )
        pod_section = Section(
            4,
            pod_lines[:1],
            [[line] for line in pod_lines[1:]] or [[Text("  none yet", style="dim")]],
            hidden=lambda n: Text(f"  +{n} more", style="dim"),
        )

        rc = "" if st.workload_rc is None else f" (exit {st.workload_rc})"
        workload = Section(
            5,
            [Text(f"Ray workload{rc}", style="bold")],
            [_wrapped(console, Text(f"  {line}"), width, 4) for line in st.workload]
            or [[Text("  (not started)", style="dim")]],
        )
        log = Section(
            OPTIONAL,
            [],
            [_wrapped(console, Text(f"· {note}", style="dim"), width) for note in self.notes],
        )
        return [header, story, demands, why, resize_section, pod_section, workload, log]


def render_summary(doc: dict[str, Any]) -> RenderableType:
    lines = [
        f"[bold]{'done' if doc['ok'] else 'NOT DONE'}[/bold] — scenario {doc['scenario']} "
        f"in {doc['seconds']}s (expected: {doc['expected']})"
    ]
    for what in ("grew", "shrank", "rolled_back"):
        for item in doc[what]:
            lines.append(f"  {what.replace('_', ' ')}: {escape(item)}")
    lines.append(f"  worker pods: {', '.join(doc['worker_pods']) or 'none'}")
    for m in doc["missing"]:
        lines.append(f"  [red]missing:[/red] {escape(m)}")
    return Panel("\n".join(lines), title="summary", border_style="green" if doc["ok"] else "red")
