"""Sandbox benchmark: list 2,000 pods; 1,000 resize patches + status round trips.

    python -m bench.sandbox_bench

The sandbox runs as `raysize sandbox up` in its own process (as in the demo and the
orchestration benchmarks), and this process talks to it with the real `kubernetes`
client over HTTP, as raysize's activities do. The sandbox's process group is stopped at
the end, whatever happens.
"""

from __future__ import annotations

import functools
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

from sandbox.rayprocs import free_port

PODS = 2000
PATCHES = 1000


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


def report(label: str, n: int, total: float, latencies: list[float], unit: str) -> None:
    lat = sorted(latencies)
    print(
        f"{label:<46} {total:6.2f} s  {n / total:6.0f} {unit}  "
        f"p50 {lat[len(lat) // 2] * 1000:5.1f} ms  p99 {lat[int(0.99 * len(lat))] * 1000:5.1f} ms"
    )


def run(kubeconfig: str) -> None:
    api: Any = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
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
    report(f"create {PODS} pods (2 threads)", PODS, total, lat, "req/s")
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
    print(f"list {PODS} pods, HTTP + JSON body (best of 5)     {min(lists) * 1000:6.1f} ms")
    print(
        f"list {PODS} pods, typed V1PodList                  {typed[0] * 1000:6.1f} ms "
        "(mostly the client building models)"
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

    def round_trip(i: int) -> None:
        patch(i, "300m")
        raw(
            core.read_namespaced_pod_status(
                f"bench-{i % PODS:04d}", "default", _preload_content=False
            )
        )

    for threads in (1, 2):
        total, lat = timed(PATCHES, threads, round_trip)
        report(
            f"{PATCHES} resize patches + status reads ({threads} thr)",
            PATCHES,
            total,
            lat,
            "trips/s",
        )
    for threads in (1, 2):
        cpu = f"{310 + threads}m"
        total, lat = timed(PATCHES, threads, functools.partial(patch, cpu=cpu))
        report(f"{PATCHES} resize patches ({threads} thr)", PATCHES, total, lat, "patch/s")

    def done() -> int:
        return sum(
            1
            for p in core.list_namespaced_pod("default").items
            if p.status.container_statuses[0].resources.limits["cpu"] == "312m"
        )

    deadline = time.monotonic() + 60
    while done() < PATCHES and time.monotonic() < deadline:
        time.sleep(0.2)
    print(f"kubelet actuated {done()}/{PATCHES} of the last resizes")
    api.close()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = str(Path(tmp) / "kubeconfig")
        cmd = [
            sys.executable,
            "-m",
            "worker.cli",
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
            run(kubeconfig)
        finally:
            os.killpg(server.pid, signal.SIGINT)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


if __name__ == "__main__":
    main()
