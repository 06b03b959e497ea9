"""Sandbox benchmark: list 2,000 pods; 1,000 resize patches; 1,000 resize round trips.

    python -m bench.sandbox_bench

The sandbox runs as `raysize sandbox up` in its own process (as in the demo and the
orchestration benchmarks), with the kubelet actuating at once (`--actuation-delay 0`),
and this process talks to it with the real `kubernetes` client over HTTP, as raysize's
activities do. Each figure is printed next to its target, then a `verdict` line (exit
code 1 if a target is missed). The one target set for the sandbox is > 500 resize patch
requests/s; the other figures have none, and say so.

A round trip is a resize patch, then status reads until the kubelet reports that resize
done (`containerStatuses[].resources` has the new value, no PodResizePending or
PodResizeInProgress): what a resize costs a client that waits for it. The sandbox's
process group is stopped at the end, whatever happens.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config

from bench.procs import stop_on_sigterm
from raysize.sandbox.ports import free_port

PODS = 2000
PATCHES = 1000
TRIPS = 1000
PATCH_TARGET = 500.0  # resize patch requests/s
NO_TARGET = "no target set"


def pod(i: int) -> dict[str, object]:
    return {
        "metadata": {"name": f"bench-{i:04d}", "labels": {"app": "bench"}},
        "spec": {
            "containers": [
                {
                    "name": "ray",
                    "image": "rayproject/ray:2.60.0",
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "128Mi"},
                        "limits": {"cpu": "200m", "memory": "256Mi"},
                    },
                }
            ]
        },
    }


def raw(response: Any) -> bytes:
    """Read the body and give the connection back to the pool, as raysize's activities do
    (an unread body makes the client open a new connection for every request)."""
    try:
        return bytes(response.data)
    finally:
        response.release_conn()


def timed(n: int, threads: int, fn: Callable[[int], object]) -> tuple[float, list[float]]:
    def one(i: int) -> float:
        t = time.perf_counter()
        fn(i)
        return time.perf_counter() - t

    started = time.perf_counter()
    if threads == 1:
        latencies = [one(i) for i in range(n)]
    else:
        with ThreadPoolExecutor(threads) as pool:
            latencies = list(pool.map(one, range(n)))
    return time.perf_counter() - started, latencies


def line(label: str, figure: str, target: str) -> None:
    print(f"{label:<40} {figure:<50} target: {target}")


def rate_figure(n: int, total: float, latencies: list[float], unit: str) -> str:
    lat = sorted(latencies)
    return (
        f"{n / total:5.0f} {unit} ({total:5.2f} s, p50 {lat[len(lat) // 2] * 1000:4.1f} ms, "
        f"p99 {lat[int(0.99 * len(lat))] * 1000:5.1f} ms)"
    )


def resized(body: bytes, cpu: str) -> bool:
    """The kubelet reports the resize to `cpu` done: applied, and no resize condition."""
    status = json.loads(body)["status"]
    applied = status["containerStatuses"][0].get("resources", {}).get("limits", {}).get("cpu")
    busy = {"PodResizePending", "PodResizeInProgress"} & {
        c["type"] for c in status.get("conditions") or []
    }
    return applied == cpu and not busy


def run(kubeconfig: str) -> bool:
    """Print every figure next to its target; True if every target is met."""
    api: Any = config.new_client_from_config(config_file=kubeconfig)
    core: Any = client.CoreV1Api(api)
    deadline = time.monotonic() + 30
    while True:
        try:
            core.read_namespace("default")
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    total, lat = timed(
        PODS,
        2,
        lambda i: raw(core.create_namespaced_pod("default", pod(i), _preload_content=False)),
    )
    line(f"create {PODS} pods (2 threads)", rate_figure(PODS, total, lat, "req/s"), NO_TARGET)
    while (
        sum(1 for p in core.list_namespaced_pod("default").items if p.status.phase == "Running")
        < PODS
    ):
        time.sleep(0.2)

    lists = [
        timed(
            1,
            1,
            lambda _: raw(
                core.list_namespaced_pod(
                    "default", label_selector="app=bench", _preload_content=False
                )
            ),
        )[0]
        for _ in range(5)
    ]
    typed = timed(1, 1, lambda _: core.list_namespaced_pod("default", label_selector="app=bench"))
    line(f"list {PODS} pods, HTTP + JSON (best of 5)", f"{min(lists) * 1000:6.1f} ms", NO_TARGET)
    line(
        f"list {PODS} pods, typed V1PodList",
        f"{typed[0] * 1000:6.1f} ms (mostly the client's models)",
        NO_TARGET,
    )

    def patch(i: int, cpu: str) -> None:
        raw(
            core.patch_namespaced_pod_resize(
                f"bench-{i % PODS:04d}",
                "default",
                [
                    {
                        "op": "replace",
                        "path": "/spec/containers/0/resources/limits/cpu",
                        "value": cpu,
                    }
                ],
                _preload_content=False,
            )
        )

    reads = [0]

    def round_trip(i: int, cpu: str) -> None:
        patch(i, cpu)
        name = f"bench-{i % PODS:04d}"
        give_up = time.monotonic() + 30
        while True:
            reads[0] += 1
            body = raw(core.read_namespaced_pod_status(name, "default", _preload_content=False))
            if resized(body, cpu):
                return
            if time.monotonic() > give_up:
                raise SystemExit(f"{name}: the kubelet never reported the resize to {cpu} done")

    for threads in (1, 2):
        reads[0] = 0
        total, lat = timed(TRIPS, threads, functools.partial(round_trip, cpu=f"{300 + threads}m"))
        line(
            f"{TRIPS} resize round trips ({threads} thr)",
            rate_figure(TRIPS, total, lat, "trips/s"),
            f"{NO_TARGET} ({reads[0] / TRIPS:.1f} status reads per trip)",
        )
    rates = {}
    for threads in (1, 2):
        total, lat = timed(PATCHES, threads, functools.partial(patch, cpu=f"{310 + threads}m"))
        rates[threads] = PATCHES / total
        met = "met" if rates[threads] > PATCH_TARGET else "MISSED"
        line(
            f"{PATCHES} resize patches ({threads} thr)",
            rate_figure(PATCHES, total, lat, "patch/s"),
            f"> {PATCH_TARGET:.0f} patch/s: {met}",
        )

    def done() -> int:
        return sum(
            1
            for p in core.list_namespaced_pod("default").items
            if p.status.container_statuses[0].resources.limits["cpu"] == "312m"
        )

    deadline = time.monotonic() + 60
    while done() < PATCHES and time.monotonic() < deadline:
        time.sleep(0.2)
    actuated = done()
    line(
        "kubelet actuated the last resizes",
        f"{actuated}/{PATCHES}",
        f"all {PATCHES}: {'met' if actuated == PATCHES else 'MISSED'}",
    )
    api.close()
    best = max(rates, key=lambda t: rates[t])
    ok = rates[best] > PATCH_TARGET and actuated == PATCHES
    print(
        f"verdict: {'PASS' if ok else 'FAIL'} - resize patches {rates[best]:.0f}/s at best "
        f"({best} thr; target > {PATCH_TARGET:.0f}/s), {actuated}/{PATCHES} actuated, "
        f"{TRIPS}/{TRIPS} round trips reported done by the kubelet"
    )
    return ok


def main() -> None:
    stop_on_sigterm()
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = str(Path(tmp) / "kubeconfig")
        cmd = [
            sys.executable,
            "-m",
            "raysize.worker.cli",
            "sandbox",
            "up",
            "--nodes",
            "4",
            "--node-cpu",
            "1000",
            "--node-memory",
            "4Ti",
            "--max-pods",
            "1000",
            "--actuation-delay",
            "0",
            "--port",
            str(free_port()),
            "--kubeconfig",
            kubeconfig,
        ]
        server = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not Path(kubeconfig).exists():
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the sandbox did not start")
                time.sleep(0.05)
            ok = run(kubeconfig)
        finally:
            os.killpg(server.pid, signal.SIGINT)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
