"""Temporal credentials that survive a real day (issue #28 item 3).

The dev server can do neither TLS nor API keys (`temporal server start-dev --help`), so a
TLS-terminating gRPC proxy stands in front of it (tests/orchestration/temporal_proxy.py):
TLS with a server certificate for `temporal.internal` only, client certificates from the
CA it trusts, API keys it accepts; everything else is the real dev server.

- Each mismatch is named, with the RAYSIZE_* variable to fix: it was "cannot reach
  Temporal at …" for all of them.
- A rotated API key file is used by the running worker; a refused key makes `ready` fail
  (not `live`), through the real probe command.
- Rotated TLS files (a new CA, a new client certificate, the server's certificate
  renewed) are applied by the running worker, in-process.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from raysize.worker.run import reconcile_input
from raysize.worker.settings import Settings
from raysize.worker.temporal import SetupError, connect
from raysize.workflows.naming import RECONCILE_WORKFLOW
from tests.orchestration.temporal_env import start_dev_server
from tests.orchestration.temporal_proxy import ProxyTls, TemporalProxy, issue, make_ca
from tests.orchestration.worker_process import Worker, probe, probe_until, worker_env

NAME = "temporal.internal"  # the only name on the proxy's server certificates


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("temporal-tls")
    for ca in ("ca", "next-ca", "stranger-ca"):
        make_ca(d, ca)
    issue(d, "ca", "server", f"DNS:{NAME}")
    issue(d, "ca", "client", "DNS:raysize")
    issue(d, "next-ca", "next-server", f"DNS:{NAME}")
    issue(d, "next-ca", "next-client", "DNS:raysize")
    issue(d, "stranger-ca", "stranger", "DNS:raysize")
    return d


@pytest_asyncio.fixture(scope="module")
async def dev() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_dev_server()
    try:
        yield env
    finally:
        await env.shutdown()


def upstream(env: WorkflowEnvironment) -> str:
    return str(env.client.service_client.config.target_host)


@dataclass
class Proxies:
    plain: TemporalProxy  # plain text, API key k1
    tls: TemporalProxy  # TLS, API key k1
    mtls: TemporalProxy  # TLS, client certificates from `ca`


@pytest.fixture(scope="module")
def proxies(dev: WorkflowEnvironment, certs: Path) -> Iterator[Proxies]:
    server = ProxyTls(certs / "server.crt", certs / "server.key")
    made = Proxies(
        plain=TemporalProxy(upstream(dev), keys={"k1"}),
        tls=TemporalProxy(upstream(dev), tls=server, keys={"k1"}),
        mtls=TemporalProxy(
            upstream(dev), tls=ProxyTls(server.cert, server.key, client_ca=certs / "ca.crt")
        ),
    )
    try:
        yield made
    finally:
        for p in (made.plain, made.tls, made.mtls):
            p.close()


def settings(address: str, **fields: object) -> Settings:
    return Settings.model_validate({"temporal_address": address, **fields})


async def refused(s: Settings) -> str:
    with pytest.raises(SetupError) as caught:
        await connect(s)
    return str(caught.value)


async def test_each_mismatch_is_named_with_the_variable_to_fix(proxies, certs, tmp_path):
    ca = certs / "ca.crt"
    key_file = tmp_path / "api-key"
    key_file.write_text("k1\n")
    (tmp_path / "old-key").write_text("k0\n")
    tls = {"temporal_tls_ca": ca, "temporal_tls_server_name": NAME}
    cases = {
        # TLS on, the server speaks plain text
        "tls-to-plain": (settings(proxies.plain.address, temporal_tls=True), "RAYSIZE_TEMPORAL_TLS: TLS is on, but Temporal at"),
        # TLS off, the server expects TLS
        "plain-to-tls": (settings(proxies.tls.address), "RAYSIZE_TEMPORAL_TLS: Temporal at"),
        # the system's CAs do not know the server's private CA
        "unknown-ca": (settings(proxies.tls.address, temporal_tls=True, temporal_tls_server_name=NAME), "RAYSIZE_TEMPORAL_TLS_CA: the certificate of Temporal at"),
        # a CA file that did not sign it
        "wrong-ca": (settings(proxies.tls.address, temporal_tls_ca=certs / "stranger-ca.crt", temporal_tls_server_name=NAME), "RAYSIZE_TEMPORAL_TLS_CA: the certificate of Temporal at"),
        # dialled by IP, the certificate is for temporal.internal
        "server-name": (settings(proxies.tls.address, temporal_tls_ca=ca), "RAYSIZE_TEMPORAL_TLS_SERVER_NAME: the certificate of Temporal at"),
        # mTLS: no client certificate, then one the server does not trust
        "no-client-cert": (settings(proxies.mtls.address, **tls), "RAYSIZE_TEMPORAL_TLS_CERT: Temporal at"),
        "client-cert-refused": (settings(proxies.mtls.address, temporal_tls_cert=certs / "stranger.crt", temporal_tls_key=certs / "stranger.key", **tls), "RAYSIZE_TEMPORAL_TLS_CERT: Temporal at"),
        # API keys
        "no-key": (settings(proxies.tls.address, **tls), "RAYSIZE_TEMPORAL_API_KEY_FILE: Temporal at"),
        "bad-key": (settings(proxies.tls.address, temporal_api_key="k2", **tls), "RAYSIZE_TEMPORAL_API_KEY: Temporal at"),
        "bad-key-file": (settings(proxies.tls.address, temporal_api_key_file=tmp_path / "old-key", **tls), "RAYSIZE_TEMPORAL_API_KEY_FILE: Temporal at"),
        # nothing there
        "unreachable": (settings("127.0.0.1:9"), "cannot reach Temporal at 127.0.0.1:9"),
    }  # fmt: skip
    said = {name: await refused(s) for name, (s, _) in cases.items()}
    wrong = {
        name: said[name] for name, (_, start) in cases.items() if not said[name].startswith(start)
    }
    assert wrong == {}, json.dumps(said, indent=1)
    assert "not for 127.0.0.1" in said["server-name"] and NAME in said["server-name"]
    assert "UnknownIssuer" in said["wrong-ca"] and "stranger-ca.crt" in said["wrong-ca"]
    assert "refused the API key (Request unauthorized)" in said["bad-key-file"]
    assert "Connection refused" in said["unreachable"]
    assert len(set(said.values())) == len(said)  # no two the same
    # and the right settings connect, each way
    for good in (
        settings(proxies.tls.address, temporal_api_key_file=key_file, **tls),
        settings(proxies.mtls.address, temporal_tls_cert=certs / "client.crt", temporal_tls_key=certs / "client.key", **tls),
    ):  # fmt: skip
        client = await connect(good)
        assert client.namespace == "default"


def test_one_api_key_at_a_time(tmp_path):
    key = tmp_path / "key"
    key.write_text("k")
    with pytest.raises(
        ValueError, match="RAYSIZE_TEMPORAL_API_KEY and RAYSIZE_TEMPORAL_API_KEY_FILE are both set"
    ):
        Settings(temporal_api_key="k", temporal_api_key_file=key)  # fmt: skip


# --- the running worker ------------------------------------------------------------------------
def replace(path: Path, content: bytes) -> None:
    """As the kubelet updates a mounted Secret: the new file appears at once, whole."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(content)
    os.replace(tmp, path)


async def a_workflow_task_completes(env: WorkflowEnvironment, task_queue: str) -> None:
    """The worker polls and completes through its (new) credentials: a reconcile
    workflow's first task is completed (its observe then fails on the Kubernetes address
    nowhere, which is not this test's concern)."""
    cluster = f"c-{uuid.uuid4().hex[:6]}"
    handle = await env.client.start_workflow(
        RECONCILE_WORKFLOW,
        reconcile_input(Settings())("default", cluster),
        id=f"creds/{cluster}",
        task_queue=task_queue,
    )
    try:
        for _ in range(120):
            history = await handle.fetch_history()
            if any(
                e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED for e in history.events
            ):
                return
            await asyncio.sleep(0.5)
        raise AssertionError("no workflow task completed in 60 s")
    finally:
        await handle.terminate()


async def test_a_rotated_api_key_file_is_used_and_a_refused_key_fails_readiness(
    dev, certs, tmp_path
):
    """The key was read once: after a rotation every call failed while both probes stayed
    green. Now the server refusing the key makes `ready` fail (not `live`: a restart does
    not fix a key), naming RAYSIZE_TEMPORAL_API_KEY_FILE; the new key in the file is used
    by the running worker, and it is ready again."""
    proxy = TemporalProxy(upstream(dev), tls=ProxyTls(certs / "server.crt", certs / "server.key"), keys={"k1"})  # fmt: skip
    key = tmp_path / "api-key"
    key.write_text("k1\n")
    queue_name = f"creds-{uuid.uuid4().hex[:6]}"
    env = worker_env(
        tmp_path, proxy.address, queue_name,
        RAYSIZE_TEMPORAL_API_KEY_FILE=str(key),
        RAYSIZE_TEMPORAL_TLS_CA=str(certs / "ca.crt"),
        RAYSIZE_TEMPORAL_TLS_SERVER_NAME=NAME,
        RAYSIZE_LOG_FORMAT="json",
    )  # fmt: skip
    worker = Worker(env)
    try:
        worker.wait_for("raysize worker polling")
        probe_until(env, "ready", 0)
        await a_workflow_task_completes(dev, queue_name)

        proxy.accept({"k2"})  # the key is revoked: k2 is the one to use now
        reason = probe_until(env, "ready", 1)
        assert "RAYSIZE_TEMPORAL_API_KEY_FILE: Temporal at" in reason, reason
        assert "refused the API key" in reason, reason
        assert probe(env, "live").returncode == 0
        worker.wait_for("Temporal refuses this worker")

        replace(key, b"k2\n")  # the Secret is updated
        said = json.loads(worker.wait_for("RAYSIZE_TEMPORAL_API_KEY_FILE changed"))
        assert said["level"] == "INFO", said
        probe_until(env, "ready", 0)
        await a_workflow_task_completes(dev, queue_name)
        worker.wait_for("accepts this worker again")
    finally:
        code = worker.stop()
        proxy.close()
    assert code == 0, worker.lines[-10:]
    assert "Traceback" not in "\n".join(worker.lines)
    assert len([ln for ln in worker.lines if "Temporal refuses this worker" in ln]) == 1


async def test_rotated_tls_files_reconnect_the_running_worker(dev, certs, tmp_path):
    """mTLS files were read once: a new CA and client certificate (the server's renewed
    with them) left the worker unable to reconnect until restarted. Now the running
    worker reconnects with the new files, in-process, and says so once."""
    proxy = TemporalProxy(
        upstream(dev),
        tls=ProxyTls(certs / "server.crt", certs / "server.key", client_ca=certs / "ca.crt"),
    )
    mounted = tmp_path / "tls"
    mounted.mkdir()
    for name, source in (
        ("ca.crt", "ca.crt"),
        ("tls.crt", "client.crt"),
        ("tls.key", "client.key"),
    ):
        (mounted / name).write_bytes((certs / source).read_bytes())
    queue_name = f"creds-{uuid.uuid4().hex[:6]}"
    env = worker_env(
        tmp_path, proxy.address, queue_name,
        RAYSIZE_TEMPORAL_TLS_CA=str(mounted / "ca.crt"),
        RAYSIZE_TEMPORAL_TLS_CERT=str(mounted / "tls.crt"),
        RAYSIZE_TEMPORAL_TLS_KEY=str(mounted / "tls.key"),
        RAYSIZE_TEMPORAL_TLS_SERVER_NAME=NAME,
    )  # fmt: skip
    worker = Worker(env)
    try:
        worker.wait_for("raysize worker polling")
        await a_workflow_task_completes(dev, queue_name)
        # the server moves to the next CA: the old files are refused from now on
        proxy.restart(ProxyTls(certs / "next-server.crt", certs / "next-server.key", client_ca=certs / "next-ca.crt"))  # fmt: skip
        reason = probe_until(env, "ready", 1)
        assert "RAYSIZE_TEMPORAL_TLS_CA: the certificate of Temporal at" in reason, reason
        assert probe(env, "live").returncode == 0
        for name, source in (("ca.crt", "next-ca.crt"), ("tls.crt", "next-client.crt"), ("tls.key", "next-client.key")):  # fmt: skip
            replace(mounted / name, (certs / source).read_bytes())
        line = worker.wait_for("changed: reconnected to Temporal")
        assert "RAYSIZE_TEMPORAL_TLS_CA, RAYSIZE_TEMPORAL_TLS_CERT, RAYSIZE_TEMPORAL_TLS_KEY changed" in line, line  # fmt: skip
        probe_until(env, "ready", 0)
        await a_workflow_task_completes(dev, queue_name)
    finally:
        code = worker.stop()
        proxy.close()
    assert code == 0, worker.lines[-10:]
    assert "Traceback" not in "\n".join(worker.lines)
    assert len([ln for ln in worker.lines if "changed: reconnected" in ln]) == 1
