"""`raysize ray status|resize` against the session cluster, and its one-line errors.

The tables `status` prints are also checked offline, from a constructed state.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import pytest
from rich.console import Console
from typer.testing import CliRunner, Result

from raysize.activities.ray_gcs import RayGcsClient
from raysize.activities.ray_state import (
    ClusterState,
    GangBundle,
    LabelConstraint,
    LabelOperator,
    LabelSelector,
    NodeStatus,
    PendingDemand,
    PendingGang,
    RayNode,
    ResourceConstraint,
)
from raysize.sandbox.localray import Driver, LocalRayCluster, holding_one_cpu, wait_for
from raysize.sandbox.ports import free_port
from raysize.worker.cli import app
from raysize.worker.cli_ray import print_status
from raysize.workflows.model import GangStrategy
from raysize.workflows.resources import Resources
from tests.ray.conftest import WORKERS

PENDING_WORK = """
import json, sys
import ray
from ray.autoscaler.sdk import request_resources
from ray.util.placement_group import placement_group

ray.init()

@ray.remote(num_cpus=2)
def two_cpus():
    return 1

tasks = [two_cpus.remote() for _ in range(3)]
pack = placement_group([{"CPU": 3}, {"CPU": 1}], strategy="PACK")
request_resources(num_cpus=6)
print(json.dumps({"event": "submitted", "pack": pack.id.hex()}))
input()
"""


def run(*args: str) -> Result:
    if args and args[0] == "resize":  # every resize here means it: see the test below
        args = (*args, "--outside-raysize")
    return CliRunner().invoke(app, ["ray", *args])


def test_resize_is_refused_without_saying_it_goes_behind_raysize() -> None:
    """`raysize ray resize` changes only the Raylet: the pod keeps its size and no saga
    records it. Without --outside-raysize it touches nothing and says why."""
    result = CliRunner().invoke(
        app,
        ["ray", "resize", "--gcs", "127.0.0.1:1", "--pod", "p", "--cpu", "2", "--memory", "2Gi"],
    )
    assert result.exit_code == 2
    assert "--outside-raysize" in one_error_line(result)
    assert "behind raysize's back" in one_error_line(result)


def one_error_line(result: Result) -> str:
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line


def tables(text: str) -> dict[str, list[list[str]]]:
    """The rows of each table rich printed, by title; a "<title>: none" line is a table
    with no rows."""
    out: dict[str, list[list[str]]] = {}
    title = ""
    for line in text.splitlines():
        if line.startswith("│"):
            out[title].append([cell.strip() for cell in line.strip().strip("│").split("│")])
        elif line.strip() and line[0] not in "┏┃┡└":
            title = line.strip().removesuffix(": none")
            out[title] = []
    return out


def test_status_tables_show_rows_free_total_idle_gangs_and_constraints() -> None:
    selector = LabelSelector(
        constraints=(LabelConstraint(key="group", operator=LabelOperator.IN, values=("cpu",)),)
    )
    state = ClusterState(
        version=3,
        session_name="session_x",
        nodes=(
            RayNode(
                node_id="cd" * 28,
                pod="gone-0",
                group="cpu-group",
                status=NodeStatus.DEAD,
                total=Resources(),
                available=Resources(),
            ),
            RayNode(
                node_id="ab" * 28,
                pod="worker-1",
                group="cpu-group",
                status=NodeStatus.IDLE,
                total=Resources.of(cpu=2000, memory=4 * 2**30),
                available=Resources.of(cpu=500, memory=2**30),
                idle_ms=5400,
            ),
            RayNode(
                node_id="ef" * 28,
                pod="worker-2",
                group="cpu-group",
                status=NodeStatus.RUNNING,
                total=Resources.of(cpu=1000, memory=10**9),
                available=Resources.of(cpu=0, memory=0),
            ),
        ),
        demands=(
            PendingDemand(shape=Resources.of(cpu=2000), count=3),
            PendingDemand(
                shape=Resources.of(cpu=500, memory=3 * 10**9), count=5, label_selectors=(selector,)
            ),
        ),
        gangs=(
            PendingGang(
                placement_group_id="c5f001000000",
                strategy=GangStrategy.STRICT_SPREAD,
                state="RESCHEDULING",
                bundles=(
                    GangBundle(shape=Resources.of(cpu=3000)),
                    # Ray's bookkeeping resources are not shown
                    GangBundle(shape=Resources({"CPU": 1000, "CPU_group_c5f001000000": 10000})),
                ),
            ),
        ),
        constraints=(
            ResourceConstraint(shape=Resources.of(cpu=1000), count=6),
            ResourceConstraint(shape=Resources.of(cpu=4000, memory=10**9), count=1),
        ),
    )
    out = io.StringIO()
    print_status(state, Console(file=out, width=160))
    shown = tables(out.getvalue())

    # live nodes first; CPU and memory as free/total; idle time only when idle
    assert shown["Ray nodes (session_x)"] == [
        ["worker-1", "cpu-group", "abababababab", "idle", "0.5/2", "1Gi/4Gi", "5s"],
        ["worker-2", "cpu-group", "efefefefefef", "running", "0/1", "0/1G", "-"],
        ["gone-0", "cpu-group", "cdcdcdcdcdcd", "dead", "0/0", "0/0", "-"],
    ]
    assert shown["Pending tasks and actors"] == [
        ["{CPU: 2}", "3", "-"],
        ["{CPU: 0.5, memory: 3000000000}", "5", "group in (cpu)"],
    ]
    assert shown["Pending placement groups"] == [
        ["c5f001000000", "STRICT_SPREAD", "RESCHEDULING", "{CPU: 3}, {CPU: 1}"]
    ]
    assert shown["request_resources() constraints"] == [
        ["{CPU: 1}", "6"],
        ["{CPU: 4, memory: 1000000000}", "1"],
    ]

    out = io.StringIO()
    print_status(ClusterState(version=1), Console(file=out, width=160))
    assert tables(out.getvalue()) == {
        "Ray nodes ()": [],
        "Pending tasks and actors": [],
        "Pending placement groups": [],
        "request_resources() constraints": [],
    }
    assert "Pending tasks and actors: none" in out.getvalue()

    # a table narrower than its title keeps the title on one line
    out = io.StringIO()
    narrow = (ResourceConstraint(shape=Resources.of(cpu=1000), count=6),)
    print_status(ClusterState(version=1, constraints=narrow), Console(file=out, width=160))
    assert tables(out.getvalue())["request_resources() constraints"] == [["{CPU: 1}", "6"]]


def test_status_prints_nodes_and_what_is_pending(
    cluster: LocalRayCluster, gcs: RayGcsClient, restore_workers: None
) -> None:
    with Driver(cluster, PENDING_WORK) as driver:
        pack = driver.expect("submitted")["pack"]

        def all_reported() -> bool:
            state = gcs.cluster_state()
            tasks = sum(d.count for d in state.demands)
            return tasks == 3 and bool(state.gangs) and bool(state.constraints)

        wait_for(
            all_reported,
            timeout=30,
            what="the tasks, the placement group and the constraint to be reported",
        )
        result = run("status", "--gcs", cluster.address)
    assert result.exit_code == 0, result.stderr
    shown = tables(result.stdout)

    (nodes,) = [rows for title, rows in shown.items() if title.startswith("Ray nodes (")]
    by_pod = {row[0]: row for row in nodes}
    assert by_pod["head-0"][1:2] == ["headgroup"]
    assert by_pod["head-0"][4] == "0/0"  # the head has no CPUs
    for pod in WORKERS:
        _, group, node_id, status, cpu, memory, idle = by_pod[pod]
        assert (group, status, cpu, memory) == ("cpu-group", "idle", "1/1", "1G/1G")
        assert len(node_id) == 12 and re.fullmatch(r"\d+s", idle)
    assert shown["Pending tasks and actors"] == [["{CPU: 2}", "3", "-"]]
    assert shown["Pending placement groups"] == [[pack, "PACK", "PENDING", "{CPU: 3}, {CPU: 1}"]]
    assert shown["request_resources() constraints"] == [["{CPU: 1}", "6"]]


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


def test_a_resize_below_what_is_in_use_says_it_was_clamped(
    cluster: LocalRayCluster,
    gcs: RayGcsClient,
    worker_ids: dict[str, str],
    restore_workers: None,
) -> None:
    worker = worker_ids["worker-2"]
    with holding_one_cpu(cluster, gcs, worker):
        args = ("resize", "--gcs", cluster.address, "--pod", "worker-2")
        result = run(*args, "--cpu", "500m", "--memory", "500M")
        as_json = run(*args, "--cpu", "500m", "--memory", "500M", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"worker-2 ({worker[:12]}): CPU 1, memory 600M",
        "  asked for CPU 0.5, memory 500M: the Raylet kept what its tasks are using",
    ]
    assert as_json.exit_code == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert doc["clamped"] is True
    assert doc["requested"] == {"CPU": 0.5, "memory": 500_000_000}
    assert (doc["applied"]["CPU"], doc["applied"]["memory"]) == (1.0, 600_000_000)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ("--pod", "no-such-pod", "--cpu", "2", "--memory", "2Gi"),
            "no Ray node for pod 'no-such-pod' (live pods: ",
        ),
        (("--node", "ab" * 28, "--cpu", "2", "--memory", "2Gi"), "no Ray node with id"),
    ],
    ids=["unknown-pod", "unknown-node"],
)
def test_resize_of_an_unknown_node_is_one_line_and_exit_1(
    cluster: LocalRayCluster, args, says
) -> None:
    result = run("resize", "--gcs", cluster.address, *args)
    assert result.exit_code == 1
    assert says in one_error_line(result)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--pod", "w", "--cpu", "2", "--memory", "lots"), "--memory: 'lots' is not a quantity"),
        (("--pod", "w", "--cpu", "0", "--memory", "2Gi"), "CPU: 0.0 must be > 0"),
        (("--pod", "w", "--cpu", "1", "--memory", "0"), "memory: 0.0 must be > 0"),
        (("--pod", "w", "--cpu", "-1", "--memory", "2Gi"), "--cpu: '-1' is negative"),
        (
            ("--pod", "w", "--node", "ab", "--cpu", "1", "--memory", "2Gi"),
            "exactly one of --node and --pod",
        ),
        (
            ("--pod", "w", "--cpu", "1", "--memory", "2Gi", "--tls-ca", "ca.crt"),
            "mutual TLS needs all of --tls-ca, --tls-cert and --tls-key",
        ),
        (
            ("--pod", "w", "--cpu", "1", "--memory", "2Gi", "--tls-server-name", "gcs"),
            "--tls-server-name needs TLS",
        ),
    ],
    ids=["bad-memory", "zero-cpu", "zero-memory", "negative-cpu", "node-and-pod", "tls", "name"],
)
def test_resize_refuses_bad_input_before_anything_is_sent(args, says) -> None:
    # Nothing listens there: had the CLI called the GCS first, it would exit 1, unreachable.
    result = run("resize", "--gcs", f"127.0.0.1:{free_port()}", *args)
    assert result.exit_code == 2, result.stderr
    assert says in one_error_line(result)


def test_an_unreachable_address_is_one_line_and_exit_1() -> None:
    # A real process, as an operator runs it.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "raysize.worker.cli",
            "ray",
            "status",
            "--gcs",
            f"127.0.0.1:{free_port()}",
        ],
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


@pytest.mark.parametrize("command", ["status", "resize"])
def test_a_token_on_the_command_line_is_refused_with_what_to_use_instead(command) -> None:
    """`--token` put the token in every `ps` listing and in shell history. Nothing is
    sent: nothing listens at the address."""
    args = ["--pod", "w", "--cpu", "1", "--memory", "2Gi"] if command == "resize" else []
    result = run(command, "--gcs", f"127.0.0.1:{free_port()}", "--token", "s3cret", *args)
    assert result.exit_code == 2
    line = one_error_line(result)
    assert line == (
        "error: --token puts the token on the command line, where ps and shell history show "
        "it: use --token-file PATH, or set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) in the "
        "environment"
    )
    assert "s3cret" not in result.stdout + result.stderr
    assert "--token " not in run(command, "--help").stdout  # no longer offered


@pytest.mark.parametrize("command", ["status", "resize"])
def test_a_token_file_that_cannot_be_used_is_bad_input(command, tmp_path) -> None:
    args = ["--pod", "w", "--cpu", "1", "--memory", "2Gi"] if command == "resize" else []
    gcs = f"127.0.0.1:{free_port()}"
    missing = run(command, "--gcs", gcs, "--token-file", str(tmp_path / "nope"), *args)
    assert missing.exit_code == 2
    assert one_error_line(missing) == (
        f"error: --token-file {tmp_path / 'nope'}: No such file or directory (give the file "
        "holding the token)"
    )
    (tmp_path / "empty").write_text("\n")
    empty = run(command, "--gcs", gcs, "--token-file", str(tmp_path / "empty"), *args)
    assert empty.exit_code == 2
    assert one_error_line(empty) == f"error: --token-file {tmp_path / 'empty'} is empty"


def test_a_missing_token_path_file_is_one_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "token"))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    result = run("status", "--gcs", f"127.0.0.1:{free_port()}")
    assert result.exit_code == 1
    line = one_error_line(result)
    assert f"cannot read the token file RAY_AUTH_TOKEN_PATH={tmp_path / 'token'}" in line
    assert "point RAY_AUTH_TOKEN_PATH at the file holding the Ray cluster's auth token" in line
