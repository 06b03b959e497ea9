"""`raysize ray status|resize` against the session cluster, and its one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner, Result

from activities.ray_gcs import RayGcsClient
from tests.ray.conftest import WORKERS
from tests.ray.harness import LocalRayCluster, free_port
from worker.cli import app


def run(*args: str) -> Result:
    return CliRunner().invoke(app, ["ray", *args])


def one_error_line(result: Result) -> str:
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line


def test_status_prints_nodes_and_demands(cluster: LocalRayCluster) -> None:
    result = run("status", "--gcs", cluster.address)
    assert result.exit_code == 0, result.stderr
    for pod in ("head-0", *WORKERS):
        assert pod in result.stdout
    assert "cpu-group" in result.stdout
    assert "Pending tasks and actors" in result.stdout


def test_status_json_is_the_cluster_state(cluster: LocalRayCluster) -> None:
    result = run("status", "--gcs", cluster.address, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    workers = [n for n in doc["nodes"] if n["pod"] in WORKERS and n["status"] != "dead"]
    assert len(workers) == 2
    assert all(n["total"]["CPU"] >= 1 for n in workers)


def test_resize_by_pod_prints_what_was_applied(
    cluster: LocalRayCluster, gcs: RayGcsClient, restore_workers: None
) -> None:
    result = run(
        "resize", "--gcs", cluster.address, "--pod", "worker-2", "--cpu", "1500m", "--memory", "2Gi"
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("worker-2 (")
    assert "CPU 1.5, memory 2Gi" in result.stdout
    node = gcs.cluster_state().node_for_pod("worker-2")
    assert node is not None

    result = run(
        "resize",
        "--gcs",
        cluster.address,
        "--node",
        node.node_id[:12],
        "--cpu",
        "2",
        "--memory",
        "3e9",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["pod"] == "worker-2" and doc["clamped"] is False
    assert (doc["applied"]["CPU"], doc["applied"]["memory"]) == (2.0, 3_000_000_000)


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (
            ("--pod", "no-such-pod", "--cpu", "2", "--memory", "2Gi"),
            1,
            "no Ray node for pod 'no-such-pod' (live pods: ",
        ),
        (("--node", "ab" * 28, "--cpu", "2", "--memory", "2Gi"), 1, "no Ray node with id"),
        (
            ("--pod", "worker-1", "--cpu", "2", "--memory", "lots"),
            2,
            "--memory: 'lots' is not a quantity",
        ),
        (("--pod", "worker-1", "--cpu", "0", "--memory", "2Gi"), 2, "CPU: 0.0 must be > 0"),
        (
            ("--pod", "worker-1", "--node", "ab", "--cpu", "1", "--memory", "2Gi"),
            2,
            "exactly one of --node and --pod",
        ),
    ],
    ids=["unknown-pod", "unknown-node", "bad-memory", "zero-cpu", "node-and-pod"],
)
def test_resize_refuses_bad_input_in_one_line(cluster: LocalRayCluster, args, code, says) -> None:
    result = run("resize", "--gcs", cluster.address, *args)
    assert result.exit_code == code
    assert says in one_error_line(result)


def test_an_unreachable_address_is_one_line_and_exit_1() -> None:
    # A real process, as an operator runs it.
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", "ray", "status", "--gcs", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: read cluster state: cannot reach Ray GCS 127.0.0.1:")


def test_a_malformed_address_is_bad_input() -> None:
    result = run("status", "--gcs", "localhost")
    assert result.exit_code == 2
    assert "is not host:port" in one_error_line(result)
