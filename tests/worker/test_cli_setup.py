"""Settings that cannot work are found at start (#16 item 7): each is one line
`error: …` naming the setting and the fix, a non-zero exit, no traceback. A watched
namespace that does not exist is one WARNING, and the worker keeps running (the namespace
may be created later). Each command runs in its own process, as an operator runs it."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from kubernetes import config
from temporalio.contrib.pydantic import pydantic_data_converter

from raysize.activities.k8s import Kube
from raysize.sandbox import temporal_servers
from raysize.sandbox.cluster import Sandbox, SandboxConfig
from raysize.sandbox.kubeconfig import write_kubeconfig
from raysize.sandbox.kubelet import KubeletTiming
from raysize.sandbox.rbac import Authorizer
from raysize.worker.run import namespace_problem
from raysize.workflows.naming import SEARCH_ATTRIBUTES
from tests.deploy.conftest import DEPLOY, SA_USER, run_kubectl
from tests.orchestration.temporal_env import STARTUP, venv_binary

RAYSIZE = str(Path(sys.executable).with_name("raysize"))
NOWHERE = "127.0.0.1:9"  # nothing listens: a check that needed Temporal would say so


@pytest_asyncio.fixture(scope="module")
async def temporal() -> AsyncIterator[str]:
    env = await temporal_servers.start_local(
        dev_server_existing_path=venv_binary("temporal"),
        dev_server_startup_timeout=STARTUP,
        data_converter=pydantic_data_converter,
        search_attributes=list(SEARCH_ATTRIBUTES),
        dev_server_log_level="error",
    )
    try:
        yield env.client.service_client.config.target_host
    finally:
        await env.shutdown()


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[tuple[Sandbox, Path]]:
    sb = Sandbox(SandboxConfig(nodes=1, timing=KubeletTiming(actuation_delay_s=0.0))).start()
    try:
        yield sb, sb.write_kubeconfig(tmp_path / "kubeconfig")
    finally:
        sb.close()


def clean_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    """The operator's environment: none of this machine's RAYSIZE_*/RAY_* settings, a
    kubeconfig that loads (its API server is never called by these checks)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYSIZE_", "RAY_"))}
    kubeconfig = tmp_path / "kubeconfig-nowhere"
    if not kubeconfig.exists():
        write_kubeconfig(kubeconfig, f"http://{NOWHERE}")
    env.update(
        {
            "HOME": str(tmp_path),
            "RAYSIZE_KUBECONFIG": str(kubeconfig),
            "RAYSIZE_TEMPORAL_ADDRESS": NOWHERE,
            "RAYSIZE_TASK_QUEUE": "setup-test",
            "RAYSIZE_NAMESPACES": "",
            **settings,
        }
    )
    return env


def raysize(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RAYSIZE, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line


@pytest.mark.parametrize(
    "args",
    [["worker"], ["status", "default/demo"], ["start", "default/demo"], ["pause", "default/demo"]],
    ids=["worker", "status", "start", "pause"],
)
async def test_an_unknown_temporal_namespace_is_one_line(temporal, tmp_path, args):
    """The worker crashed with a traceback; `status` said "no such workflow"."""
    env = clean_env(
        tmp_path, RAYSIZE_TEMPORAL_ADDRESS=temporal, RAYSIZE_TEMPORAL_NAMESPACE="no-such-ns"
    )
    assert one_error_line(raysize(env, *args)) == (
        "error: RAYSIZE_TEMPORAL_NAMESPACE: namespace 'no-such-ns' does not exist on Temporal at "
        f"{temporal}. Set RAYSIZE_TEMPORAL_NAMESPACE to an existing namespace, or create it: "
        "temporal operator namespace create --namespace no-such-ns"
    )


async def test_an_existing_temporal_namespace_is_accepted(temporal, tmp_path):
    env = clean_env(tmp_path, RAYSIZE_TEMPORAL_ADDRESS=temporal)
    done = raysize(env, "start", "default/setup-demo")  # no worker polls: it just waits
    assert done.returncode == 0, done.stderr
    assert raysize(env, "stop", "default/setup-demo").returncode == 0


def test_a_missing_ray_token_file_stops_the_worker_before_it_starts(tmp_path):
    """It crashed with a traceback; now it is refused before Temporal is even dialled
    (nothing listens at RAYSIZE_TEMPORAL_ADDRESS)."""
    missing = tmp_path / "ray-token"
    env = clean_env(tmp_path, RAY_AUTH_TOKEN_PATH=str(missing))
    assert one_error_line(raysize(env, "worker")) == (
        f"error: cannot read the token file RAY_AUTH_TOKEN_PATH={missing}: No such file or "
        "directory (point RAY_AUTH_TOKEN_PATH at the file holding the Ray cluster's auth "
        "token, or unset it)"
    )
    missing.write_text("\n")
    assert one_error_line(raysize(env, "worker")) == (
        f"error: the token file RAY_AUTH_TOKEN_PATH={missing} is empty (point "
        "RAY_AUTH_TOKEN_PATH at the file holding the Ray cluster's auth token, or unset it)"
    )


def test_ray_tls_without_a_ca_stops_the_worker_before_it_starts(tmp_path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_text("cert")
    key.write_text("key")
    tls = {"RAY_USE_TLS": "1", "RAY_TLS_SERVER_CERT": str(cert), "RAY_TLS_SERVER_KEY": str(key)}
    env = clean_env(tmp_path, **tls)
    assert one_error_line(raysize(env, "worker")) == (
        "error: RAY_USE_TLS is set but RAY_TLS_CA_CERT is not: Ray's TLS needs RAY_TLS_CA_CERT, "
        "RAY_TLS_SERVER_CERT and RAY_TLS_SERVER_KEY (set RAY_TLS_CA_CERT to its file, or unset "
        "RAY_USE_TLS)"
    )
    env = clean_env(tmp_path, RAY_TLS_CA_CERT=str(tmp_path / "ca.crt"), **tls)
    assert one_error_line(raysize(env, "worker")) == (
        f"error: RAY_TLS_CA_CERT: '{tmp_path / 'ca.crt'}' is not a file (RAY_USE_TLS is set: "
        "point RAY_TLS_CA_CERT at the file, or unset RAY_USE_TLS)"
    )


def worker_until_polling(env: dict[str, str]) -> tuple[list[str], int | None, int]:
    """Run `raysize worker` until it says it is polling, then stop it with SIGTERM (its own
    process group). Returns its log lines up to then, whether it was still running then
    (None: it was), and its exit code."""
    proc = subprocess.Popen(
        [RAYSIZE, "worker"], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
        text=True, start_new_session=True,
    )  # fmt: skip
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    try:
        while True:
            line = lines.get(timeout=120)
            if line is None:
                break
            seen.append(line)
            if "raysize worker polling" in line:
                break
        running = proc.poll()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=60)
    return seen, running, code


async def test_a_watched_namespace_that_does_not_exist_is_one_warning(temporal, sandbox, tmp_path):
    """Listing a namespace that does not exist returns nothing, like an empty one: it was
    watched silently. Now the worker names it once at start, and keeps running."""
    _, kubeconfig = sandbox
    env = clean_env(
        tmp_path,
        RAYSIZE_TEMPORAL_ADDRESS=temporal,
        RAYSIZE_KUBECONFIG=str(kubeconfig),
        RAYSIZE_NAMESPACES="default,no-such-ns",
        RAYSIZE_TASK_QUEUE=f"setup-{tmp_path.name[-8:]}",
    )
    seen, running, code = worker_until_polling(env)
    assert running is None, seen  # it kept running
    assert code == 0, seen  # and stopped cleanly on SIGTERM
    warnings = [line for line in seen if " WARNING " in line]
    assert len(warnings) == 1, seen
    assert warnings[0].endswith(
        "RAYSIZE_NAMESPACES: namespace 'no-such-ns' does not exist; raysize keeps watching it "
        "and manages its RayClusters once it is created (with raysize's Role in it, "
        "deploy/watched-namespace)"
    ), warnings[0]
    assert not [line for line in seen if "default" in line and "WARNING" in line]


def test_a_watched_namespace_without_raysizes_role_is_named(sandbox):
    """With the per-namespace install, raysize has no Role in a namespace that does not
    exist yet (nor in one it was not granted): the API server refuses, and the check says
    which namespace and what to give it."""
    sb, kubeconfig = sandbox
    applied = run_kubectl("apply", "-k", str(DEPLOY), kubeconfig=kubeconfig)
    assert applied.returncode == 0, applied.stderr
    kube = Kube(config.new_client_from_config(config_file=str(kubeconfig)), timeout_s=5.0)
    kube.core.create_namespace({"metadata": {"name": "team-x"}})  # exists, no Role there
    sb.api.authorizer = Authorizer(sb.store, SA_USER)  # every request is the worker's now
    try:
        assert namespace_problem(kube, "default") is None  # deploy/ grants there
        for ns in ("team-x", "no-such-ns"):
            assert namespace_problem(kube, ns) == (
                f"RAYSIZE_NAMESPACES: raysize may not act in namespace {ns!r}: it does not exist "
                "yet, or raysize has no Role there (deploy/watched-namespace); nothing in it is "
                "managed until both are there"
            )
    finally:
        sb.api.authorizer = None
    # and the check stored nothing (a dry run)
    events = kube.core.list_namespaced_event("default")
    assert not [e for e in events.items if e.metadata.name == "raysize-namespace-check"]
