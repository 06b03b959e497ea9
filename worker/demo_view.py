"""What `raysize demo` shows: the state it polls, as JSON lines (`--headless`) or a live
terminal view (rich), and the summary at the end."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO
from urllib.parse import quote

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from worker.demo_scenarios import ResizeView, Scenario
from workflows.resources import CPU, MEMORY, units_to_float, units_to_quantity

MIB = 1024**2


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
    """The live terminal view, refreshed by every poll (about 4 times a second)."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self.notes: list[str] = []
        self._live: Live | None = None
        self._last: DemoState | None = None
        self._closed = False

    def event(self, doc: dict[str, Any]) -> None:
        kind = doc.get("event")
        if kind == "summary":
            self.close()
            self.console.print(render_summary(doc))
            if doc["resizes"]:
                self.console.print("Resize workflows in the Temporal UI:")
                for r in doc["resizes"]:
                    # one line each, never wrapped, so a terminal can open it
                    self.console.print(
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
            self.notes.append(escape(str(doc.get("message", ""))))
        elif kind == "resize" and doc.get("closed"):
            self.notes.append(
                f"resize of {doc['pod']} {doc['from_cpu']} → {doc['cpu']} CPU: "
                f"[bold]{doc['outcome']}[/bold]"
            )
        self.notes = self.notes[-6:]
        if self._last is not None:
            self.refresh(self._last)

    def refresh(self, state: DemoState) -> None:
        self._last = state
        if self._closed:
            return
        view = render(state, self.notes)
        if self._live is None:
            self._live = Live(view, console=self.console, auto_refresh=False, transient=False)
            self._live.start()
        self._live.update(view, refresh=True)

    def close(self) -> None:
        self._closed = True
        if self._live is not None:
            self._live.stop()
            self._live = None


def render(state: DemoState, notes: list[str]) -> RenderableType:
    s = state.scenario
    head = Text.assemble(
        ("raysize demo", "bold"),
        f" — {s.name}: {s.title}\n",
        ("expected end: ", "dim"),
        s.expect,
        ("   stage: ", "dim"),
        state.stage,
        ("   elapsed: ", "dim"),
        f"{state.elapsed():.0f}s\n",
        ("Temporal UI: ", "dim"),
        f"http://localhost:{state.ui_port}",
        ("   Ctrl-C stops everything", "dim"),
    )

    pods = Table(title="Pods (spec → running)", expand=True)
    for col in ("pod", "role", "phase", "node", "cpu", "memory", "resize"):
        pods.add_column(col)
    for p in sorted(state.pods.values(), key=lambda p: (p.role != "head", p.name)):
        cpu = p.cpu if p.cpu == p.cpu_now or not p.cpu_now else f"{p.cpu_now} → {p.cpu}"
        mem = (
            p.memory
            if p.memory == p.memory_now or not p.memory_now
            else f"{p.memory_now} → {p.memory}"
        )
        pods.add_row(p.name, p.role, p.phase, p.node, cpu, mem, p.resize or "-")

    ray = Table(title="Ray nodes (Raylet totals from the GCS)", expand=True)
    for col in ("pod", "status", "CPU total", "CPU free", "memory GiB"):
        ray.add_column(col)
    for r in sorted(state.raylets.values(), key=lambda r: r.pod):
        ray.add_row(
            r.pod or r.node_id[:12],
            r.status,
            f"{r.cpu_total:g}",
            f"{r.cpu_available:g}",
            f"{r.memory_total_gib:.1f}",
        )

    demands = Text("pending demands: ", style="dim")
    demands.append(", ".join(state.demands) or "none", style="yellow" if state.demands else "")

    resizes = Table(title="Resize workflows", expand=True)
    for col in ("workflow", "cpu", "phase", "outcome", "attempts"):
        resizes.add_column(col)
    for rv in sorted(state.resizes.values(), key=lambda v: (v.workflow_id, v.run_id)):
        style = {"Succeeded": "green", "RolledBack": "red"}.get(rv.outcome, "")
        resizes.add_row(
            rv.workflow_id,
            resize_text(rv),
            rv.phase,
            Text(rv.outcome, style=style),
            "; ".join(rv.attempts)[-60:],
        )

    tail = state.workload[-6:] or ["(not started)"]
    rc = "" if state.workload_rc is None else f" (exit {state.workload_rc})"
    workload = Panel("\n".join(tail), title=f"Ray workload{rc}")
    parts: list[RenderableType] = [head, pods, ray, demands, resizes, workload]
    if notes:
        parts.append(Text.from_markup("\n".join(notes)))
    return Group(*parts)


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
