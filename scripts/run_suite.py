"""Every test, in two halves at once: what `make suite` (and so `make test` and CI) runs.

The tiers that start real Ray, the real control plane or a whole world (`real`, `ray`,
`e2e`) spend most of their time waiting on those processes, and the rest (`unit`,
`temporal`, `sandbox`) take about a fifth of the suite; run one after the other, the
suite is their sum. Here the light half runs in a second pytest beside the heavy one, so
the suite takes about as long as the heavy half. Both are the same `pytest` with the
same configuration, each told its tiers with `-m`: together they select every test once
(a test run in both worlds is `real` in its `[real]` form: tests/conftest.py).

The heavy half prints as it goes; the light half's output is kept in a file and printed
when it ends, whole. At the very end: each half's result and time, and each tier's time
(tests/conftest.py writes them to RAYSIZE_TIER_TIMES). The exit code is non-zero if
either half failed. Arguments are passed to both halves (`-x`, `-k …`).

Each half runs in its own process group; stopped (Ctrl-C, SIGTERM), this stops both.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HEAVY = "real or ray or e2e"
NO_TESTS = 5  # pytest's exit code when nothing was selected
TIERS = ("unit", "temporal", "sandbox", "real", "ray", "e2e")


def start(marks: str, args: list[str], times: Path, out: Any) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RAYSIZE_TIER_TIMES": str(times)}
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-m", marks, *args],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
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


def main(args: list[str]) -> int:
    work = Path(tempfile.mkdtemp(prefix="raysize-suite-"))
    light_log = work / "light.log"
    began = time.monotonic()
    procs: list[subprocess.Popen[bytes]] = []
    ended: dict[str, float] = {}

    def on_signal(signum: int, _frame: Any) -> None:
        stop(procs)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with light_log.open("wb") as out:
        light = start(f"not ({HEAVY})", args, work / "light.json", out)
        procs.append(light)
        heavy = start(HEAVY, args, work / "heavy.json", None)
        procs.append(heavy)
        while light.poll() is None or heavy.poll() is None:
            for name, proc in (("light", light), ("heavy", heavy)):
                if proc.poll() is not None and name not in ended:
                    ended[name] = time.monotonic() - began
            time.sleep(0.5)
        for name in ("light", "heavy"):
            ended.setdefault(name, time.monotonic() - began)
    print(f"\n{'=' * 30} the light half ({'unit, temporal, sandbox'}) {'=' * 30}", flush=True)
    sys.stdout.buffer.write(light_log.read_bytes())
    print(f"\n{'=' * 34} the whole suite {'=' * 34}")
    # given arguments (`-k`, a path), a half may select nothing: pytest's 5 is no failure
    fine = {0, NO_TESTS} if args else {0}
    for name, proc in (("light", light), ("heavy", heavy)):
        verdict = "passed" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
        if proc.returncode == NO_TESTS and args:
            verdict = "no test selected"
        print(f"{name:<6} half: {verdict} after {ended[name]:.0f} s")
    print(f"suite: {time.monotonic() - began:.0f} s (the halves ran at once)")
    print(tier_table(work / "light.json", work / "heavy.json"))
    return 0 if {light.returncode, heavy.returncode} <= fine else 1


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
