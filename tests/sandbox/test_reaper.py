"""What the sandbox starts is stopped when the process that started it dies, even by
SIGKILL (`raysize.sandbox.reaper`), and nothing else is touched."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from raysize.sandbox import reaper

ROOT = Path(__file__).resolve().parents[2]

# an owner: starts `sleep` in its own session and guards it, registers two clean-ups and
# drops one of them, makes a temporary folder with a file in it, prints the sleep's PID,
# then waits for stdin (or stops and removes both itself and exits when told "tidy"; told
# "tidy-unwaited", it kills the sleep without waiting for it: a zombie until the owner
# exits, as a group's stragglers are until PID 1 waits for them)
OWNER = textwrap.dedent(
    """
    import subprocess, sys
    from raysize.sandbox import reaper
    marker, dropped, mode, parent = sys.argv[1:5]
    sleeper = subprocess.Popen(["sleep", "300"], start_new_session=True)
    reaper.guard(sleeper)
    reaper.on_exit("marker", ["touch", marker])
    reaper.on_exit("dropped", ["touch", dropped])
    reaper.drop("dropped")
    scratch = reaper.temp_dir("scratch ", parent)
    (scratch / "data").write_text("x")
    print(sleeper.pid, flush=True)
    if mode.startswith("tidy"):
        sleeper.kill()
        if mode == "tidy":
            sleeper.wait()
        else:
            while open(f"/proc/{sleeper.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
                pass
        reaper.drop("marker")
        reaper.remove_dir(scratch)
        sys.exit(0)
    sys.stdin.read()
    """
)


def gone(pid: int, start: str) -> bool:
    """Exited (a zombie has exited; a reused PID is another process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return reaper.start_time(pid) != start or stat[stat.rfind(")") + 2] == "Z"


def wait_gone(pid: int, start: str, within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if gone(pid, start):
            return True
        time.sleep(0.05)
    return False


def scratch_parent(tmp_path: Path) -> Path:
    """Where the owner makes its temporary folder (named with a space: paths may hold one)."""
    parent = tmp_path / "scratch root"
    parent.mkdir(exist_ok=True)
    return parent


def owner(tmp_path: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            OWNER,
            str(tmp_path / "marker"),
            str(tmp_path / "dropped"),
            mode,
            str(scratch_parent(tmp_path)),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_a_sigkilled_owners_process_groups_are_stopped_and_its_clean_ups_run(tmp_path):
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)  # not the owner's
    proc = owner(tmp_path, "wait")
    try:
        assert proc.stdout is not None and proc.stderr is not None
        sleeper = int(proc.stdout.readline())
        start = reaper.start_time(sleeper)
        assert start and not gone(sleeper, start)
        os.killpg(proc.pid, signal.SIGKILL)  # the owner's own group only: not the sleeper's
        proc.wait(timeout=10)
        assert wait_gone(sleeper, start), "the SIGKILLed owner's sleep still runs"
        # the reaper shares the owner's stderr: it ends when the reaper does
        said = proc.stderr.read()
        assert f"raysize: process {proc.pid} is gone; stopped process group(s) {sleeper}" in said
        assert "cleaned up marker" in said
        assert (tmp_path / "marker").exists()
        assert not (tmp_path / "dropped").exists()  # dropped: not run
        assert list(scratch_parent(tmp_path).iterdir()) == []  # its temporary folder: removed
        assert bystander.poll() is None  # nothing it was not told of
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("mode", ["tidy", "tidy-unwaited"])
def test_an_owner_that_exits_normally_leaves_no_reaper_and_it_does_nothing(tmp_path, mode):
    """A clean stop says nothing: a group whose processes have ended but are not yet
    waited for (zombies) is not something left running (the demo's clean stop said
    `process … is gone; stopped process group(s) …` of its Ray pods' ended groups)."""
    proc = owner(tmp_path, mode)
    out, err = proc.communicate(timeout=30)  # stderr closes once the reaper is gone too
    assert proc.returncode == 0, err
    assert err == ""  # nothing was left to stop or clean up
    assert int(out)
    assert not (tmp_path / "marker").exists()
    assert list(scratch_parent(tmp_path).iterdir()) == []  # removed by the owner


def test_a_group_whose_pid_went_to_another_process_is_not_touched():
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        start = reaper.start_time(other.pid)
        assert reaper._ours(other.pid, start)
        # told of a group led by a process that started at another time: not ours
        assert not reaper._ours(other.pid, str(int(start) + 1))
        assert reaper.reap({other.pid: str(int(start) + 1)}, {}) == []
        assert other.poll() is None
        # a group that ended is skipped
        other.kill()
        other.wait()
        assert not reaper._ours(other.pid, start)
    finally:
        with contextlib.suppress(ProcessLookupError):
            other.kill()
        other.wait()


def test_a_group_of_zombies_is_not_alive_and_not_reported():
    ended = subprocess.Popen(["sleep", "300"], start_new_session=True)
    start = reaper.start_time(ended.pid)
    try:
        assert reaper.group_alive(ended.pid) and reaper._ours(ended.pid, start)
        ended.kill()
        while not gone(ended.pid, start):  # a zombie: not waited for yet
            time.sleep(0.01)
        os.killpg(ended.pid, 0)  # the kernel still finds the group …
        assert not reaper.group_alive(ended.pid)  # … but nothing in it runs
        assert reaper.reap({ended.pid: start}, {}) == []
    finally:
        ended.kill()
        ended.wait()


# A test's own processes: the raysize worker and the Ray driver scripts of tests/e2e, run
# by a pytest that is then SIGKILLed (CI's timeout does that). They were left running:
# the upgrade test's two workers outlived a killed run
TEST_OWNER = textwrap.dedent(
    """
    import sys
    from tests.e2e.conftest import start_script, start_worker
    from pathlib import Path
    script = start_script("import time; time.sleep(300)")
    worker = start_worker({"PATH": "/nonexistent", "RAYSIZE_TEMPORAL_ADDRESS": "x"},
                          Path(sys.argv[1]))
    print(script.pid, worker.pid, flush=True)
    sys.stdin.read()
    """
)


def test_a_killed_pytest_leaves_no_worker_or_driver_of_its_tests(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", TEST_OWNER, str(tmp_path / "worker.log")],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        starts = [reaper.start_time(p) or "" for p in pids]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        for pid, start in zip(pids, starts, strict=True):
            assert wait_gone(pid, start), f"process {pid} outlived the SIGKILLed pytest"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
