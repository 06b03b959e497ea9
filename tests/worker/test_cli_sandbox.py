"""`raysize sandbox up` as a user runs it: a foreground process that kubectl can talk to,
that Ctrl-C stops with everything it started, and that refuses bad flags in one line."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from typer.testing import CliRunner

from raysize.sandbox.faults import parse_fault
from raysize.sandbox.ports import free_port
from raysize.worker.cli import app
from tests.orchestration.temporal_env import venv_binary
from tests.sandbox.conftest import pod_body, wait_for
from tests.sandbox.test_kubectl_and_operator import raycluster

ROOT = Path(__file__).resolve().parents[2]
BANNER_END = "Ctrl-C stops everything."


# --- processes, as /proc sees them ------------------------------------------------------------
def _stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, state, start time) of a process; None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), fields[0], fields[19]


def descendants(pid: int) -> dict[int, str]:
    """Every process below `pid`, with its start time (to tell a reused pid)."""
    children: dict[int, list[int]] = {}
    started: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[0], []).append(int(entry.name))
            started[int(entry.name)] = stat[2]
    out: dict[int, str] = {}
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out[child] = started[child]
        todo += children.get(child, [])
    return out


def still_running(processes: dict[int, str]) -> list[int]:
    """Those that still run (a zombie has exited; a reused pid is another process)."""
    return [
        pid
        for pid, start in processes.items()
        if (stat := _stat(pid)) is not None and stat[2] == start and stat[1] != "Z"
    ]


def comm(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/comm").read_text().strip()
    return ""


# --- the sandbox as a subprocess --------------------------------------------------------------
@dataclass
class Up:
    proc: subprocess.Popen[str]
    kubeconfig: Path
    port: int
    banner: list[str]
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)

    def rest_of_stdout(self, timeout: float) -> list[str]:
        out, deadline = [], time.monotonic() + timeout
        while (line := self.lines.get(timeout=max(0.0, deadline - time.monotonic()))) is not None:
            out.append(line)
        return out

    def ctrl_c(self, within: float) -> tuple[int, float]:
        """SIGINT to its process group, as Ctrl-C in a terminal; (exit code, seconds)."""
        started = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGINT)
        code = self.proc.wait(timeout=within)
        return code, time.monotonic() - started

    def api(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.kubeconfig))


@contextlib.contextmanager
def sandbox_up(
    tmp_path: Path,
    *args: str,
    start_timeout: float = 30,
    real: bool = False,
    sigint: signal.Handlers = signal.SIG_DFL,
) -> Iterator[Up]:
    """`raysize sandbox up ARGS` in its own process group. SIGINT: how it starts with
    Ctrl-C set (a shell's background job without job control starts with it ignored,
    whatever the test runner's own setting is)."""
    port = free_port()
    kubeconfig = tmp_path / "kube" / "config"
    stderr = (tmp_path / "stderr").open("w")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "raysize.worker.cli", "sandbox", "up"),
            *(("--control-plane", "real") if real else ("--port", str(port))),
            *("--kubeconfig", str(kubeconfig), *args),
        ],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        start_new_session=True,  # its own process group, as a terminal job
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
    )
    up = Up(proc, kubeconfig, port, [])

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            up.lines.put(line.rstrip("\n"))
        up.lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + start_timeout
        while BANNER_END not in up.banner:
            try:
                line = up.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError(
                    f"no banner; stdout {up.banner}, stderr {(tmp_path / 'stderr').read_text()}"
                )
            up.banner.append(line)
        yield up
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        stderr.close()


def kubectl(up: Up, *args: str) -> str:
    done = subprocess.run(
        [venv_binary("kubectl"), "--kubeconfig", str(up.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": str(up.kubeconfig.parent)},  # kubectl's cache stays in tmp
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


# --- tests --------------------------------------------------------------------------------
@pytest.mark.parametrize("real", [False, True], ids=["embedded", "real-control-plane"])
def test_ctrl_c_stops_it_even_when_started_with_ctrl_c_ignored(tmp_path, real):
    """`raysize sandbox up &` from a script (no job control) starts with SIGINT ignored;
    Ctrl-C to its process group still stops it and everything it started (with the real
    control plane: etcd, kube-apiserver and the KubeRay operator), as SIGTERM does."""
    args = () if real else ("--nodes", "1")
    with sandbox_up(tmp_path, *args, real=real, start_timeout=180, sigint=signal.SIG_IGN) as up:
        children = descendants(up.proc.pid)
        assert not real or len(children) >= 3, children
        code, _ = up.ctrl_c(within=60)
        assert code == 0
        assert up.rest_of_stdout(timeout=5) == ["raysize sandbox: stopping"]
        assert still_running(children) == []
        assert real or not listening(up.port)


def test_a_sigkilled_real_sandbox_takes_its_control_plane_along(tmp_path):
    """SIGKILL cannot be caught: `sandbox up`'s reaper (`raysize.sandbox.reaper`) sees
    it gone and stops etcd, kube-apiserver and the KubeRay operator, each in a session of
    its own, that would otherwise run on."""
    with sandbox_up(tmp_path, real=True, start_timeout=180) as up:
        children = descendants(up.proc.pid)
        names = {comm(pid) for pid in children}
        assert {"etcd", "kube-apiserver"} <= names, names
        os.kill(up.proc.pid, signal.SIGKILL)
        up.proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while still_running(children) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = still_running(children)
        assert left == [], [comm(pid) for pid in left]
    said = (tmp_path / "stderr").read_text()
    assert f"raysize: process {up.proc.pid} is gone; stopped process group(s)" in said


def test_up_serves_kubectl_the_nodes_asked_for_and_ctrl_c_stops_it(tmp_path):
    args = ("--nodes", "2", "--node-cpu", "3", "--node-memory", "4Gi")
    with sandbox_up(tmp_path, *args) as up:
        assert f"  export KUBECONFIG={up.kubeconfig}" in up.banner
        assert up.banner[0].startswith(
            f"raysize sandbox: Kubernetes API at http://127.0.0.1:{up.port} "
        )
        assert "(embedded API server; 2 node(s), 3 CPU / 4Gi each)" in up.banner[0]
        table = kubectl(up, "get", "nodes").splitlines()
        assert table[0].split()[:2] == ["NAME", "STATUS"]
        assert [row.split()[:2] for row in table[1:]] == [
            ["sandbox-node-0", "Ready"],
            ["sandbox-node-1", "Ready"],
        ]
        capacity = kubectl(
            up,
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.status.capacity.cpu} {.status.capacity.memory}{'\\n'}{end}",
        )
        assert capacity.splitlines() == ["3 4Gi", "3 4Gi"]
        children = descendants(up.proc.pid)
        code, took = up.ctrl_c(within=15)
        assert code == 0
        assert took < 10
        assert up.rest_of_stdout(timeout=5) == ["raysize sandbox: stopping"]
        assert still_running(children) == []
        assert not listening(up.port)


@pytest.mark.parametrize("real", [False, True], ids=["embedded", "real-control-plane"])
def test_fault_flag_fails_the_requests_it_names(tmp_path, real):
    """The same rule in both worlds; with the real API server the written kubeconfig goes
    through a fault proxy, and a second one (`<kubeconfig>.direct`) goes around it."""
    fault = "verb=patch,resource=pods/resize,status=409,times=1"
    args = ("--fault", fault, "--actuation-delay", "0")
    with sandbox_up(tmp_path, *args, real=real, start_timeout=180) as up:
        assert "  fault: patch pods/resize: 409 for 100% of requests (at most 1)" in up.banner
        direct = up.kubeconfig.with_name(f"{up.kubeconfig.name}.direct")
        assert (f"  export KUBECONFIG={direct}" in up.banner) == real
        api = up.api()
        core = client.CoreV1Api(api)
        core.create_namespaced_pod("default", pod_body("p", requests={"cpu": "100m"}))
        wait_for(lambda: core.read_namespaced_pod("p", "default").status.phase == "Running")
        body = {
            "spec": {"containers": [{"name": "c0", "resources": {"requests": {"cpu": "200m"}}}]}
        }
        with pytest.raises(ApiException) as exc:
            core.patch_namespaced_pod_resize("p", "default", body)
        assert exc.value.status == 409
        core.read_namespaced_pod("p", "default")  # other verbs are untouched
        resized = core.patch_namespaced_pod_resize("p", "default", body)  # used up: times=1
        assert resized.spec.containers[0].resources.requests["cpu"] == "200m"
        api.close()
        assert up.ctrl_c(within=60)[0] == 0


def test_ctrl_c_stops_the_ray_processes_too(tmp_path):
    """One Ray head (the lightest Ray there is): SIGINT must leave no Ray process behind."""
    with sandbox_up(tmp_path, "--with-ray", "--node-cpu", "4", "--node-memory", "8Gi") as up:
        api = up.api()
        co = client.CustomObjectsApi(api)
        co.create_namespaced_custom_object(
            "ray.io", "v1", "default", "rayclusters", raycluster(replicas=0)
        )
        wait_for(
            lambda: (
                co.get_namespaced_custom_object("ray.io", "v1", "default", "rayclusters", "rc")
                .get("status", {})
                .get("state")
                == "ready"
            ),
            timeout=120,
        )
        api.close()

        def ray_processes() -> dict[int, str] | None:
            below = descendants(up.proc.pid)
            return below if {"gcs_server", "raylet"} <= {comm(pid) for pid in below} else None

        ray = wait_for(ray_processes, timeout=60)
        try:
            code, took = up.ctrl_c(within=60)
            assert code == 0
            assert took < 30  # one grace period for all Ray processes (10 s), not one each
            assert still_running(ray) == []
        finally:
            for pid in still_running(ray):  # left behind: stop them by their own group
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(os.getpgid(pid), signal.SIGKILL)


# --- bad flags: one line, exit 2 ------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--node-cpu", "abc"], "error: --node-cpu: 'abc' is not a quantity; expected a"),
        (["--node-memory", "0"], "error: --node-cpu and --node-memory must be positive"),
        (["--nodes", "0"], "error: --nodes 0: expected at least 1"),
        (["--port", "70000"], "error: --port 70000: expected 0..65535"),
        (["--fault", "verb=frobnicate"], "error: --fault 'verb=frobnicate': fault verb"),
        (["--fault", "rate=2"], "error: --fault 'rate=2': fault error_rate 2.0: expected 0..1"),
        (["--fault", "status=404"], "error: --fault 'status=404': fault codes [404]: expected"),
        (["--fault", "rate=often"], "error: --fault 'rate=often': rate='often' is not a finite"),
        (["--fault", "verb=get"], "error: --fault 'verb=get': the rule does nothing"),
        (["--fault", "patch"], "error: --fault 'patch': 'patch' is not key=value; expected"),
        (["--fault", "colour=red"], "error: --fault 'colour=red': unknown key 'colour'"),
        (
            ["--control-plane", "kind"],
            "error: --control-plane 'kind': expected 'embedded' or 'real'",
        ),
        (
            ["--control-plane", "real", "--port", "8080"],
            "error: --port needs the embedded API server (the real one listens on a free "
            "port): drop it, or use --control-plane embedded",
        ),
    ],
)
def test_bad_flags_are_one_line_errors_with_exit_2(tmp_path, args, message):
    result = CliRunner().invoke(app, ["sandbox", "up", "--kubeconfig", str(tmp_path / "kc"), *args])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(message)
    assert not (tmp_path / "kc").exists()


def test_a_busy_port_is_a_one_line_error_with_exit_2(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(
            app, ["sandbox", "up", "--port", str(port), "--kubeconfig", str(tmp_path / "kc")]
        )
    assert result.exit_code == 2
    assert result.stderr == f"error: cannot listen on port {port}: Address already in use\n"


def test_fault_rules_parse_every_key():
    rule = parse_fault(
        "verb=watch, resource=pods/*, status=429|500, rate=0.25, latency=0.1, disconnect=2, times=3"
    )
    assert (rule.verb, rule.resource, rule.codes, rule.error_rate) == (
        "watch",
        "pods/*",
        (429, 500),
        0.25,
    )
    assert (rule.latency_s, rule.watch_disconnect_after_s, rule.times) == (0.1, 2.0, 3)
    assert parse_fault("latency=0.5").matches("delete", "rayclusters")  # verb, resource: any


def test_up_with_the_real_control_plane_runs_kuberays_pods_and_resizes_them(tmp_path):
    """`--control-plane real`: kube-apiserver + the real KubeRay operator make the example
    cluster's pods, the kubelet simulator runs them and actuates a resize, and
    `kubectl describe pod` shows the kubelet's resize events. Ctrl-C stops it all."""
    with sandbox_up(tmp_path, "--node-cpu", "8", start_timeout=180, real=True) as up:
        assert (
            "(kube-apiserver v1.36.3 + KubeRay v1.6.1; 1 node(s), 8 CPU / 32Gi each)"
            in (up.banner[0])
        )
        assert up.banner[0].startswith("raysize sandbox: Kubernetes API at https://127.0.0.1:")
        kubectl(up, "apply", "-f", str(ROOT / "deploy" / "examples" / "raycluster-ippr.yaml"))

        def worker() -> str | None:
            rows = kubectl(up, "get", "pods", "-l", "ray.io/group=cpu", "--no-headers")
            running = [r.split()[0] for r in rows.splitlines() if "Running" in r]
            return running[0] if running else None

        name = wait_for(worker, timeout=90)
        kubectl(
            up, "patch", "pod", name, "--subresource=resize", "--type=strategic", "-p",
            '{"spec":{"containers":[{"name":"ray-worker","resources":'
            '{"requests":{"cpu":"2"},"limits":{"cpu":"2"}}}]}}',
        )  # fmt: skip
        described = wait_for(
            lambda: (
                (out := kubectl(up, "describe", "pod", name)) and "ResizeCompleted" in out and out
            ),
            timeout=60,
        )
        assert "kubelet" in described
        code, _ = up.ctrl_c(within=60)
        assert code == 0
