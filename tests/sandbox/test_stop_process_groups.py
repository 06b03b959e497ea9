"""The sandbox stops its Ray processes by process group: all are signalled before any is
waited for, they share one grace period, and what is left is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from raysize.sandbox.rayprocs import stop_process_groups

# On SIGTERM: say so, then exit only once every sibling has said so too. Stopped one by
# one, the first would wait for the others forever and be SIGKILLed at its deadline.
POLITE = """
import pathlib, signal, sys, time
me, peers = pathlib.Path(sys.argv[1]), [pathlib.Path(p) for p in sys.argv[2:]]
def on_term(*_):
    me.write_text("TERM")
    while not all(p.exists() for p in peers):
        time.sleep(0.02)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
me.with_suffix(".ready").write_text("")
while True:
    time.sleep(1)
"""

# Ignores SIGTERM, and so does the child it leaves in its process group.
STUBBORN = """
import pathlib, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
pathlib.Path(sys.argv[1]).write_text(str(child.pid))
while True:
    time.sleep(1)
"""


def spawn(code: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code, *args], start_new_session=True)


def wait_for_files(*paths: Path) -> None:
    end = time.monotonic() + 30
    while not all(p.exists() for p in paths):
        assert time.monotonic() < end, f"not all of {paths} appeared"
        time.sleep(0.05)


def running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_all_groups_are_signalled_before_any_is_waited_for(tmp_path: Path) -> None:
    marks = [tmp_path / f"p{i}" for i in range(3)]
    procs = [spawn(POLITE, str(m), *(str(o) for o in marks if o != m)) for m in marks]
    try:
        wait_for_files(*(m.with_suffix(".ready") for m in marks))
        stop_process_groups(procs, grace_s=20)
        # each exited by itself, which it could only do once all had been signalled
        assert [p.returncode for p in procs] == [0, 0, 0]
        assert all(m.read_text() == "TERM" for m in marks)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


def test_what_ignores_sigterm_is_killed_with_its_whole_group(tmp_path: Path) -> None:
    pid_files = [tmp_path / f"s{i}" for i in range(2)]
    procs = [spawn(STUBBORN, str(f)) for f in pid_files]
    try:
        wait_for_files(*pid_files)
        children = [int(f.read_text() or 0) for f in pid_files]
        while 0 in children:  # the file is there, its content a moment later
            time.sleep(0.05)
            children = [int(f.read_text() or 0) for f in pid_files]
        stop_process_groups(procs, grace_s=1)
        assert [p.returncode for p in procs] == [-signal.SIGKILL, -signal.SIGKILL]
        assert not any(running(c) for c in children)  # their children went too
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
