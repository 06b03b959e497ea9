"""Probes for a worker that serves no HTTP: a heartbeat file and a Temporal reachability check.

The Deployment in deploy/ runs them as exec probes (standard library only, so a probe
starts in a fraction of a second):

    python -m worker.health live     # liveness
    python -m worker.health ready    # readiness
    python -m worker.health ready --wait 300   # init container: block until Temporal answers

`live` fails when the heartbeat file exists and is older than `--max-age` seconds (the
worker's event loop has stopped turning). `ready` fails when the Temporal frontend
($RAYSIZE_TEMPORAL_ADDRESS, default localhost:7233) refuses a TCP connection, when the
heartbeat is stale, or when the worker's own view of its Temporal connection (the file
`<heartbeat>.temporal`, written by worker/temporal.py `TemporalWatch` when the state
changes) says Temporal refuses its credentials or TLS, or has been unreachable for more
than `--max-unreachable` seconds. `live` ignores that file: a restart does not fix a bad
key. A missing heartbeat file passes both checks: until the worker writes one, `live`
only proves the container runs.

How the worker must call it (worker/run.py, `run_worker`, first statement, before
connecting to Temporal, so a restarted container overwrites a stale beat at once):

    from raysize.worker.health import heartbeat
    beat = asyncio.create_task(heartbeat())
    try:
        ...  # everything run_worker does now
    finally:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat

`heartbeat()` does nothing unless $RAYSIZE_HEALTH_FILE names a file (the Deployment sets
it to /tmp/raysize/heartbeat); it touches the file every `interval_s` seconds and removes
it when cancelled.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

HEALTH_FILE_ENV = "RAYSIZE_HEALTH_FILE"
TEMPORAL_ADDRESS_ENV = "RAYSIZE_TEMPORAL_ADDRESS"
DEFAULT_TEMPORAL_ADDRESS = "localhost:7233"
DEFAULT_INTERVAL_S = 10.0
DEFAULT_MAX_AGE_S = 60.0
DEFAULT_MAX_UNREACHABLE_S = 60.0
STATE_OK, STATE_UNREACHABLE, STATE_REFUSED = "ok", "unreachable", "refused"


def heartbeat_path(env: Mapping[str, str] | None = None) -> Path | None:
    """The heartbeat file from $RAYSIZE_HEALTH_FILE, or None when heartbeats are off."""
    env = os.environ if env is None else env
    value = env.get(HEALTH_FILE_ENV, "").strip()
    return Path(value) if value else None


def beat(path: Path) -> None:
    """Write the heartbeat now (atomically: a probe never reads a half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{time.time():.3f}\n")
    os.replace(tmp, path)


async def heartbeat(path: Path | None = None, interval_s: float = DEFAULT_INTERVAL_S) -> None:
    """Beat every `interval_s` seconds until cancelled; then remove the file."""
    path = path if path is not None else heartbeat_path()
    if path is None:
        return
    try:
        while True:
            beat(path)
            await asyncio.sleep(interval_s)
    finally:
        with contextlib.suppress(OSError):
            path.unlink()


def heartbeat_age(path: Path, now: float | None = None) -> float | None:
    """Seconds since the last beat, or None when there is no heartbeat file."""
    try:
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return None
    return max(0.0, (time.time() if now is None else now) - mtime)


def split_address(address: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` → (host, port); port 7233 when absent."""
    address = address.strip()
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        port = rest.lstrip(":")
        return host, int(port) if port else 7233
    host, sep, port = address.rpartition(":")
    if not sep:
        return address, 7233
    return host, int(port)


def temporal_reachable(address: str, timeout_s: float) -> str | None:
    """None when a TCP connection to `address` opens, else why not."""
    try:
        host, port = split_address(address)
    except ValueError:
        return f"{TEMPORAL_ADDRESS_ENV}={address!r} is not host:port"
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"Temporal at {address} is not reachable: {exc}"


def temporal_state_path(heartbeat: Path) -> Path:
    """Where the worker records its Temporal connection: beside the heartbeat."""
    return heartbeat.with_name(heartbeat.name + ".temporal")


def write_temporal_state(path: Path, state: str, since: float, reason: str = "") -> None:
    """Record the connection's state (atomically), since when, and why."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"state": state, "since": since, "reason": reason}) + "\n")
    os.replace(tmp, path)


def check_temporal_state(
    path: Path | None, max_unreachable_s: float, now: float | None = None
) -> str | None:
    """None unless the worker recorded that Temporal refuses it, or has not answered for
    more than `max_unreachable_s`; else the reason."""
    if path is None:
        return None
    try:
        state = json.loads(path.read_text())
        kind, since, reason = str(state["state"]), float(state["since"]), str(state["reason"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no record (yet): the other checks decide
    if kind == STATE_REFUSED:
        return reason
    now = time.time() if now is None else now
    if kind == STATE_UNREACHABLE and now - since > max_unreachable_s:
        return f"{reason} (for {now - since:.0f}s, more than {max_unreachable_s:.0f}s)"
    return None


def check_live(path: Path | None, max_age_s: float) -> str | None:
    """None when live, else the reason."""
    if path is None:
        return None
    age = heartbeat_age(path)
    if age is not None and age > max_age_s:
        return f"heartbeat {path} is {age:.0f}s old (more than {max_age_s:.0f}s)"
    return None


def check_ready(
    path: Path | None,
    max_age_s: float,
    address: str,
    timeout_s: float,
    max_unreachable_s: float = DEFAULT_MAX_UNREACHABLE_S,
) -> str | None:
    """None when ready, else the reason."""
    return (
        check_live(path, max_age_s)
        or check_temporal_state(temporal_state_path(path) if path else None, max_unreachable_s)
        or temporal_reachable(address, timeout_s)
    )


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(prog="python -m worker.health", description=__doc__)
    parser.add_argument("check", choices=["live", "ready"])
    parser.add_argument("--max-age", type=float, default=DEFAULT_MAX_AGE_S, help="seconds")
    parser.add_argument("--timeout", type=float, default=3.0, help="TCP connect timeout (s)")
    parser.add_argument(
        "--wait", type=float, default=0.0, help="retry for up to this many seconds (ready)"
    )
    parser.add_argument(
        "--max-unreachable",
        type=float,
        default=DEFAULT_MAX_UNREACHABLE_S,
        help="seconds the worker may have found Temporal unreachable before `ready` fails",
    )
    args = parser.parse_args(argv)
    path = heartbeat_path(env)
    address = env.get(TEMPORAL_ADDRESS_ENV, "") or DEFAULT_TEMPORAL_ADDRESS
    deadline = time.monotonic() + args.wait
    while True:
        if args.check == "live":
            problem = check_live(path, args.max_age)
        else:
            problem = check_ready(path, args.max_age, address, args.timeout, args.max_unreachable)
        if problem is None:
            return 0
        if time.monotonic() >= deadline:
            print(f"raysize {args.check}: {problem}", file=sys.stderr)
            return 1
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


if __name__ == "__main__":
    sys.exit(main())
