"""Every test, in three parts at once: what `make suite` (and so `make test` and CI) runs.

The tiers that start real Ray, the real control plane or a whole world (`real`, `ray`,
`e2e`) spend most of their time waiting on those processes, and the rest (`unit`,
`temporal`, `sandbox`) take about a sixth of the suite; run one after the other, the
suite is their sum (2,990 s summed on 2026-11-27, CPU 55 % busy with two parts). So the
suite runs as three pytests side by side, each told its tests with `-m`; together they
select every test once (a test run in both worlds is `real` in its `[real]` form:
tests/conftest.py):

- `real`: every test against the real control plane (1,360 s summed),
- `e2e+ray`: the embedded-world e2e tests and real Ray (1,183 s),
- `light`: unit, temporal and sandbox (422 s).

The `real` part prints as it goes; the others' output is kept in files and printed, whole,
when all have ended. At the very end: each part's result and time, and each tier's time
(tests/conftest.py writes them to RAYSIZE_TIER_TIMES). The exit code is non-zero if any
part failed. Arguments are passed to every part (`-x`, `-k …`).

Each part runs in its own process group, so its tests' processes are its own. Stopped
(Ctrl-C, SIGTERM), this stops every part with SIGINT, so pytest's teardown stops what it
started; and should this process itself be killed outright (SIGKILL of `make`), each part
gets SIGINT from the kernel (PR_SET_PDEATHSIG), so no part runs on alone.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

# (name, pytest -m expression); the first prints as it goes
PARTS = (
    ("real", "real"),
    ("e2e+ray", "(e2e or ray) and not real"),
    ("light", "not (real or ray or e2e)"),
)
NO_TESTS = 5  # pytest's exit code when nothing was selected
TIERS = ("unit", "temporal", "sandbox", "real", "ray", "e2e")
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGINT when the parent (this script) dies, however."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGINT)


def start(
    marks: str, args: list[str], times: Path, out: IO[bytes] | None
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RAYSIZE_TIER_TIMES": str(times)}
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-m", marks, *args],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT if out is not None else None,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # pytest's own teardown stops what it started
    for proc in procs:
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def file_name(part: str) -> str:
    return part.replace("+", "-")


def main(args: list[str]) -> int:
    work = Path(tempfile.mkdtemp(prefix="raysize-suite-"))
    began = time.monotonic()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    ended: dict[str, float] = {}

    def on_signal(signum: int, _frame: Any) -> None:
        stop(list(procs.values()))
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    logs = {name: work / f"{file_name(name)}.log" for name, _ in PARTS[1:]}
    outs = {name: path.open("wb") for name, path in logs.items()}
    try:
        for name, marks in PARTS:
            procs[name] = start(marks, args, work / f"{file_name(name)}.json", outs.get(name))
        while len(ended) < len(procs):
            for name, proc in procs.items():
                if proc.poll() is not None and name not in ended:
                    ended[name] = time.monotonic() - began
            time.sleep(0.5)
    finally:
        for out in outs.values():
            out.close()
    for name, path in logs.items():
        marks = dict(PARTS)[name]
        print(f"\n{'=' * 30} the {name} part (-m '{marks}') {'=' * 30}", flush=True)
        sys.stdout.buffer.write(path.read_bytes())
        sys.stdout.buffer.flush()
    print(f"\n{'=' * 34} the whole suite {'=' * 34}")
    # given arguments (`-k`, a path), a part may select nothing: pytest's 5 is no failure
    fine = {0, NO_TESTS} if args else {0}
    for name, proc in procs.items():
        verdict = "passed" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
        if proc.returncode == NO_TESTS and args:
            verdict = "no test selected"
        print(f"{name:<8} part: {verdict} after {ended[name]:.0f} s")
    print(f"suite: {time.monotonic() - began:.0f} s (the parts ran at once)")
    print(tier_table(*(work / f"{file_name(name)}.json" for name, _ in PARTS)))
    return 0 if {p.returncode for p in procs.values()} <= fine else 1


def tier_table(*files: Path) -> str:
    """Each tier's tests and time (setup, call and teardown summed), from both halves."""
    totals: dict[str, list[float]] = {}
    for f in files:
        if not f.exists():
            continue
        for tier, (seconds, tests) in json.loads(f.read_text()).items():
            t = totals.setdefault(tier, [0.0, 0.0])
            t[0] += seconds
            t[1] += tests
    lines = ["time per tier (summed over the tier's tests):"]
    for tier in TIERS:
        if tier in totals:
            seconds, tests = totals[tier]
            lines.append(f"  {tier:<9} {int(tests):>5} tests {seconds:>8.1f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
