"""Stop what this process started once it is gone, even when it dies by SIGKILL.

The sandbox, the real test world and the demo start process groups (etcd, the
kube-apiserver, the KubeRay operator, pods' Ray processes, a Temporal dev server) and
pod network namespaces. They stop them on every exit they see, but a process killed
with SIGKILL (or by the OOM killer) sees nothing, and its children would run on.

So the first time a process starts something, it also starts one *reaper*: this file
run as a script, in a session of its own (a Ctrl-C at the terminal does not reach it),
reading lines on its stdin. The starting process alone holds the pipe's write end (the
descriptor is not inherited by what it starts, and a fork's child closes its copy), so
end-of-file on that pipe means the process is gone, however it went. The reaper then:

1. sends SIGTERM to each process group it was told of that still runs, waits up to
   `GRACE_S` for them to end, and sends SIGKILL to what is left;
2. runs the clean-up commands it was told of, newest first (`ip netns del …`).

A group is identified by its leader's PID *and* start time (`/proc/<pid>/stat`): if the
PID now belongs to another process, the group is not touched. While any member of a
group lives, the kernel does not give its ID to a new process, so a group whose leader
has exited is still ours. Nothing is stopped by name.

Owner side: `guard(proc)` after starting a process group (`start_new_session=True`),
or `guard_group(pgid)` for one started by other code,
`on_exit(key, argv)` / `drop(key)` for clean-up commands, `temp_dir(prefix)` /
`remove_dir(path)` for a temporary folder. Stopping a group yourself
needs no message: an ended group is skipped. At a normal exit the owner closes the pipe
and waits for the reaper, so that it too is gone when the owner is.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

GRACE_S = 3.0  # between SIGTERM and SIGKILL
CLEANUP_TIMEOUT_S = 10.0  # per clean-up command


def start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return ""
    # the command name may hold spaces and parentheses: the fields follow the last ')'
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else ""


# --- the owner's side -----------------------------------------------------------------------


class _Guard:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pipe: IO[bytes] | None = None

    def _send(self, line: str) -> None:
        with self._lock:
            if self._pipe is None:
                # -I: isolated, and the script's folder is not put on sys.path (this
                # folder's operator.py and selectors.py would hide the standard library's)
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid())],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,
                )
                self._pipe = self._proc.stdin
            assert self._pipe is not None
            try:
                self._pipe.write(line.encode() + b"\n")
                self._pipe.flush()
            except OSError as err:  # the reaper is gone: say so, go on without it
                print(f"raysize: the process reaper is gone ({err})", file=sys.stderr)

    def close(self) -> None:
        """At a normal exit: end the reaper (it stops what is left) and wait for it, so
        that nothing of ours outlives us."""
        with self._lock:
            proc, pipe = self._proc, self._pipe
            self._proc = self._pipe = None
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=GRACE_S + 2 * CLEANUP_TIMEOUT_S)

    def _after_fork_in_child(self) -> None:
        # a forked child must not keep the pipe open: the reaper would outwait its parent
        if self._pipe is not None:
            with contextlib.suppress(OSError, ValueError):
                self._pipe.close()  # this copy only: the parent's stays open
        self._lock = threading.Lock()
        self._proc = self._pipe = None


_GUARD = _Guard()
os.register_at_fork(after_in_child=_GUARD._after_fork_in_child)
atexit.register(_GUARD.close)


def close() -> None:
    """This process is about to exit (a CLI that leaves with os._exit, skipping atexit):
    end the reaper now and wait for it. Not for a process that goes on: the reaper would
    stop every group still registered."""
    _GUARD.close()


def guard(proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """Stop proc's process group (proc leads it: `start_new_session=True`) if this
    process dies first."""
    guard_group(proc.pid)


def guard_group(pgid: int) -> None:
    """Stop process group `pgid` (led by the process of that PID, as it runs now) if this
    process dies first: for a group started by other code than a `Popen` of ours (the
    Temporal SDK's servers: `sandbox/temporal_servers.py`)."""
    _GUARD._send(f"group {pgid} {start_time(pgid) or '-'}")


def on_exit(key: str, argv: Sequence[str]) -> None:
    """Run argv if this process dies first (until `drop(key)`); `key` has no spaces."""
    _GUARD._send(f"cleanup {key} {json.dumps(list(argv))}")


def drop(key: str) -> None:
    """The clean-up registered as `key` was done here: the reaper forgets it."""
    _GUARD._send(f"drop {key}")


def _dir_key(path: Path) -> str:
    return "dir:" + str(path).replace("%", "%25").replace(" ", "%20")


def temp_dir(prefix: str, parent: str | None = None) -> Path:
    """A new temporary folder (`tempfile.mkdtemp`) that is removed if this process dies
    before `remove_dir` removes it."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    keep_removed(path)
    return path


def remove_dir(path: Path) -> None:
    """Remove a folder from `temp_dir` (or registered with `keep_removed`) now."""
    shutil.rmtree(path, ignore_errors=True)
    drop(_dir_key(path))


def keep_removed(path: Path) -> None:
    """Remove the existing folder path if this process dies before `remove_dir`."""
    on_exit(_dir_key(path), ["rm", "-rf", "--", str(path)])


# --- the reaper -----------------------------------------------------------------------------


def group_alive(pgid: int) -> bool:
    """Does a process of group pgid still run? Zombies do not count: a process that has
    ended but that its parent has not yet waited for (PID 1 in a container may take a
    second or two) has nothing left to stop, though `killpg(pgid, 0)` still finds it."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # state ppid pgrp …
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def _ours(pgid: int, started: str) -> bool:
    """Does group pgid still run, and is it the one we were told of?"""
    now = start_time(pgid)
    if now and started != "-" and now != started:
        return False  # the PID is another process's now
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or not ours to signal
        return False
    return group_alive(pgid)


def reap(groups: dict[int, str], cleanups: dict[str, list[str]]) -> list[str]:
    """Stop the groups that still run, then run the clean-ups; what was done, in words."""
    alive = [g for g, started in groups.items() if _ours(g, started)]
    done = [f"stopped process group(s) {', '.join(map(str, alive))}"] if alive else []
    for g in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(g, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [g for g in alive if _ours(g, groups[g])]
    for g in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(g, signal.SIGKILL)
    for key, argv in reversed(list(cleanups.items())):
        try:
            result = subprocess.run(
                argv, capture_output=True, timeout=CLEANUP_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            done.append(f"clean-up {key} failed: {err}")
            continue
        if result.returncode == 0:
            done.append(f"cleaned up {key}")
    return done


def main(argv: Sequence[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    owner = argv[0] if argv else "?"
    groups: dict[int, str] = {}
    cleanups: dict[str, list[str]] = {}
    for raw in sys.stdin.buffer:
        what, _, rest = raw.decode(errors="replace").strip().partition(" ")
        try:
            if what == "group":
                pgid, _, started = rest.partition(" ")
                groups[int(pgid)] = started or "-"
            elif what == "cleanup":
                key, _, command = rest.partition(" ")
                cleanups[key] = [str(a) for a in json.loads(command)]
            elif what == "drop":
                cleanups.pop(rest, None)
        except ValueError:
            print(f"raysize reaper: ignored a malformed line {raw!r}", file=sys.stderr)
    # end of file: the owner is gone
    done = reap(groups, cleanups)
    if done:
        print(f"raysize: process {owner} is gone; {'; '.join(done)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
