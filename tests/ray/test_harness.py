"""The real-Ray harness itself: stopping a cluster stops every node even when one fails,
and killing a node never raises for a slow death. No Ray: `sleep` processes stand in."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from raysize.sandbox import localray as harness
from raysize.sandbox.localray import LocalRayCluster, RayNodeProcess


def sleeper(pod: str, tmp_path: Path) -> RayNodeProcess:
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    return RayNodeProcess(pod=pod, group="g", proc=proc, log=tmp_path / f"{pod}.log")


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[RayNodeProcess]]:
    made = [sleeper(pod, tmp_path) for pod in ("head-0", "worker-1", "worker-2")]
    try:
        yield made
    finally:
        for node in made:  # each one, whatever the test did to the others
            node.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=10)


def test_a_node_that_fails_to_stop_does_not_leave_the_others_running(
    nodes: list[RayNodeProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_stop = harness.stop_group
    failing = nodes[1].proc

    def stop_group(proc: subprocess.Popen[bytes], grace: float = 3.0) -> None:
        if proc is failing:
            raise PermissionError("not allowed")
        real_stop(proc, grace)

    monkeypatch.setattr(harness, "stop_group", stop_group)
    cluster = LocalRayCluster(root=tmp_path, nodes=list(nodes))
    with pytest.raises(PermissionError, match="not allowed") as caught:
        cluster.stop()
    assert "while stopping Ray node worker-1" in "".join(caught.value.__notes__)
    assert nodes[0].proc.poll() is not None and nodes[2].proc.poll() is not None
    assert failing.poll() is None


def test_every_failure_is_raised_after_all_nodes_were_tried(
    nodes: list[RayNodeProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tried: list[str] = []

    def stop_group(proc: subprocess.Popen[bytes], grace: float = 3.0) -> None:
        tried.append(next(n.pod for n in nodes if n.proc is proc))
        if proc is not nodes[1].proc:
            raise OSError(f"cannot stop {proc.pid}")

    monkeypatch.setattr(harness, "stop_group", stop_group)
    with pytest.raises(BaseExceptionGroup) as caught:
        LocalRayCluster(root=tmp_path, nodes=list(nodes)).stop()
    assert tried == ["worker-2", "worker-1", "head-0"]
    assert len(caught.value.exceptions) == 2


def test_kill_falls_back_to_the_pid_and_never_raises_a_timeout(
    nodes: list[RayNodeProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = nodes[0]
    real_wait = node.proc.wait
    waits: list[float | None] = []

    def slow_first_wait(timeout: float | None = None) -> int:
        waits.append(timeout)
        if len(waits) == 1:
            raise subprocess.TimeoutExpired("sleep", timeout or 0)
        return real_wait(timeout)

    with monkeypatch.context() as patch:
        patch.setattr(node.proc, "wait", slow_first_wait)
        node.kill(timeout=2)
    assert len(waits) == 2 and node.proc.poll() is not None and node.killed

    stuck = nodes[1]

    def never(timeout: float | None = None) -> int:
        raise subprocess.TimeoutExpired("sleep", timeout or 0)

    with monkeypatch.context() as patch:
        patch.setattr(stuck.proc, "wait", never)
        with pytest.warns(UserWarning, match="ray start for worker-1 .* still runs after"):
            stuck.kill(timeout=0.1)
