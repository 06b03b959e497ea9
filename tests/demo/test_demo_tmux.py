"""`raysize demo` as a user sees it: the live view in an 80×24 tmux pane (Debian's tmux,
on the machine's image), read with `capture-pane` while the story runs, after it ends,
and after Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.demo.test_demo import ROOT, alive, free_port, group_members

PHASES = {"ShrinkingRaylet", "Polling", "RollingBack", "SyncingRaylet", "Done"}
OUTCOMES = {"Pending", "Succeeded", "RolledBack", "PodGone", "Canceled"}
WAIT_S = 300  # a bound on each wait, so a broken demo fails instead of hanging


class Pane:
    """One tmux server of our own (its own socket), one 80×24 pane running a command."""

    def __init__(self, socket: Path) -> None:
        tmux = shutil.which("tmux")
        assert tmux, "tmux not found: it is on the machine's image (Debian package tmux)"
        self.base = [tmux, "-f", os.devnull, "-S", str(socket)]

    def tmux(self, *args: str) -> str:
        return subprocess.run(
            [*self.base, *args], check=True, capture_output=True, text=True
        ).stdout

    def start(self, command: str) -> int:
        self.tmux(
            "new-session", "-d", "-x", "80", "-y", "24", "-s", "demo", command,
            ";", "set-option", "-t", "demo", "remain-on-exit", "on",
        )  # fmt: skip
        return int(self.tmux("display", "-p", "-t", "demo", "#{pane_pid}"))

    def screen(self) -> list[str]:
        lines = self.tmux("capture-pane", "-p", "-t", "demo").split("\n")
        return [line.rstrip() for line in lines[:24]]

    def wait_for(self, what: str, ok: Callable[[list[str]], bool]) -> list[str]:
        deadline = time.monotonic() + WAIT_S
        while True:
            lines = self.screen()
            if ok(lines):
                return lines
            assert time.monotonic() < deadline, f"never saw {what}:\n" + "\n".join(lines)
            time.sleep(0.5)

    def exit_status(self, pid: int) -> int | None:
        """The command's exit status once it has ended. tmux (3.3a) may mark the pane dead
        without the status and leave the process an unreaped zombie: then the status is
        read from the zombie's /proc/PID/stat (its last field, waitpid's encoding)."""
        fmt = "#{pane_dead} #{pane_dead_status}"
        dead, _, status = self.tmux("display", "-p", "-t", "demo", fmt).strip().partition(" ")
        if dead == "1" and status.isdigit():
            return int(status)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        if fields[0] != "Z":
            return None
        raw = int(fields[-1])
        return (raw >> 8) & 0xFF if raw & 0x7F == 0 else 128 + (raw & 0x7F)

    def kill(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.tmux("kill-server")


@contextlib.contextmanager
def demo_pane(tmp_path: Path, *args: str) -> Iterator[tuple[Pane, int]]:
    pane = Pane(tmp_path / "tmux.sock")
    command = shlex.join([sys.executable, "-m", "raysize.worker.cli", "demo", *args])
    pid = pane.start(f"cd {shlex.quote(str(ROOT))} && PYTHONPATH=. exec {command}")
    try:
        yield pane, pid
    finally:  # a passing test finds nothing left; a failing one leaves nothing either
        started = children(pid)
        if pane.exit_status(pid) is None:  # Ctrl-C first: the demo stops what it started
            pane.tmux("send-keys", "-t", "demo", "C-c")
            deadline = time.monotonic() + 60
            while pane.exit_status(pid) is None and time.monotonic() < deadline:
                time.sleep(0.5)
        for group in (pid, *started):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        pane.kill()


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    out.append(int(entry.name))
    return out


def section(lines: list[str], title: str) -> list[list[str]]:
    """The rows of one of the view's tables, split into cells."""
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("  +"):
            continue
        if not line.startswith("demo-"):
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def test_the_live_view_fits_80x24_and_follows_the_cluster_until_ctrl_c(tmp_path: Path) -> None:
    ports = ["--temporal-port", str(free_port()), "--ui-port", str(free_port())]
    with demo_pane(tmp_path, "--scenario", "timeout", *ports) as (pane, pid):
        lines = pane.wait_for("the story's end", lambda s: " · done in " in s[0])
        # the top of the view is the top of the pane: it fits, nothing scrolled away
        assert lines[0].startswith("raysize demo timeout · done in ")
        assert lines[1].startswith("Temporal UI http://localhost:")
        resizes = section(lines, "Resizes")
        for pod, cpu, phase, outcome, *_ in resizes:  # none of them cut short
            assert pod.startswith("demo-small-worker-") and "…" not in pod
            assert re.fullmatch(r"\d+(\.\d+)? → \d+(\.\d+)?", cpu)
            assert phase in PHASES and outcome in OUTCOMES
        rolled_back = [r for r in resizes if r[3] == "RolledBack"]
        assert [r[1:4] for r in rolled_back] == [["1 → 1.5", "Done", "RolledBack"]]
        # the grow fits the stuck node's room, so it is asked for once, and times out there
        assert rolled_back[0][4].startswith("1.5: timed out")
        # the second pod is launched at 2 CPU: its one resize brings its Raylet to it
        assert ["2 → 2", "Done", "Succeeded"] in [r[1:4] for r in resizes]
        # why: the reconcile's own words for the second pod
        assert "launch 1 × small: 1 for {CPU: 1.5} pending, at 2 CPU/1Gi" in "\n".join(lines)
        assert "Ray workload (exit 0)" in lines and "  workload finished" in lines
        # after the summary the view goes on: the grown pod shrinks back once idle (60 s)
        lines = pane.wait_for(
            "the idle shrink after the story",
            lambda s: ["2 → 1", "Done", "Succeeded"] in [r[1:4] for r in section(s, "Resizes")],
        )
        text = "\n".join(lines)
        assert re.search(r"shrink demo-small-worker-\w+: idle [\d.]+s ≥ 60s after growing", text)
        started = children(pid)  # the dev server, the worker, the Ray processes
        assert len(started) >= 4, started
        pane.tmux("send-keys", "-t", "demo", "C-c")
        pane.wait_for("the demo's exit", lambda s: pane.exit_status(pid) is not None)
        assert pane.exit_status(pid) == 0  # Ctrl-C after a story that reached its end
        after = pane.screen()
        assert "stopped: nothing the demo started is left running" in after
        left = {p: group_members(p) for p in [pid, *started] if group_members(p)}
        assert left == {} and not [p for p in started if alive(p)]
