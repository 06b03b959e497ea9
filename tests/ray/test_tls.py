"""Mutual TLS, as Ray's GCS requires with RAY_USE_TLS=1, against a stand-in GCS.

Certificates are made with the `openssl` command. The server certificate names only
`gcs.internal`, so dialling 127.0.0.1 needs `server_name` (the client),
`--tls-server-name` or `RAY_TLS_SERVER_NAME` (the CLI and the worker), as the TLS
section of docs/design/ray-protocol.md warns.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from typer.testing import CliRunner, Result

from raysize.activities.ray_gcs import RayGcsClient, RayUnavailable, TlsConfig
from raysize.activities.ray_proto import ray_autoscaler_pb2 as pb
from raysize.worker.cli import app


def run(*args: str) -> Result:
    return CliRunner().invoke(app, ["ray", *args])


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def issue(name: str, san: str, cwd: Path) -> None:
    openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=cwd)
    openssl(
        "req", "-new", "-key", f"{name}.key", "-subj", f"/CN={name}", "-out", f"{name}.csr", cwd=cwd
    )
    (cwd / f"{name}.ext").write_text(f"subjectAltName={san}\n")
    openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.crt",
        cwd=cwd,
    )  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tls")
    openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key", cwd=d)
    openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=raysize-test-ca", "-days", "1",
        "-out", "ca.crt", cwd=d,
    )  # fmt: skip
    issue("server", "DNS:gcs.internal", d)
    issue("client", "DNS:raysize", d)
    return d


@pytest.fixture(scope="module")
def tls_gcs(certs: Path) -> Iterator[str]:
    reply = pb.GetClusterResourceStateReply(
        cluster_resource_state=pb.ClusterResourceState(
            node_states=[pb.NodeState(node_id=bytes(28), instance_id="head-0", status=pb.IDLE)]
        )
    ).SerializeToString()
    handler = grpc.method_handlers_generic_handler(
        "ray.rpc.autoscaler.AutoscalerStateService",
        {"GetClusterResourceState": grpc.unary_unary_rpc_method_handler(lambda req, ctx: reply)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    credentials = grpc.ssl_server_credentials(
        [((certs / "server.key").read_bytes(), (certs / "server.crt").read_bytes())],
        root_certificates=(certs / "ca.crt").read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


def test_mutual_tls_with_the_servers_name(certs: Path, tls_gcs: str) -> None:
    tls = TlsConfig(
        certs / "ca.crt", certs / "client.crt", certs / "client.key", server_name="gcs.internal"
    )
    with RayGcsClient(tls_gcs, tls=tls, timeout=5) as client:
        assert [n.pod for n in client.cluster_state().nodes] == ["head-0"]


def test_a_name_mismatch_or_plaintext_is_unavailable(certs: Path, tls_gcs: str) -> None:
    tls = TlsConfig(certs / "ca.crt", certs / "client.crt", certs / "client.key")
    with RayGcsClient(tls_gcs, tls=tls, timeout=5) as client, pytest.raises(RayUnavailable):
        client.cluster_state()
    with RayGcsClient(tls_gcs, timeout=5) as client, pytest.raises(RayUnavailable):
        client.cluster_state()


def test_the_cli_dials_an_ip_not_in_the_certificate_with_tls_server_name(
    certs: Path, tls_gcs: str
) -> None:
    files = (
        "--tls-ca", str(certs / "ca.crt"),
        "--tls-cert", str(certs / "client.crt"),
        "--tls-key", str(certs / "client.key"),
    )  # fmt: skip
    named = run("status", "--gcs", tls_gcs, *files, "--tls-server-name", "gcs.internal")
    assert named.exit_code == 0, named.stderr
    assert "head-0" in named.stdout

    unnamed = run("status", "--gcs", tls_gcs, *files, "--timeout", "5")
    assert unnamed.exit_code == 1
    assert "cannot reach Ray GCS" in unnamed.stderr
    assert "certificate does not name the address dialled" in unnamed.stderr
    assert "--tls-server-name or RAY_TLS_SERVER_NAME" in unnamed.stderr


def test_rays_tls_settings_and_ray_tls_server_name_from_the_environment(
    certs: Path, tls_gcs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_USE_TLS", "1")
    monkeypatch.setenv("RAY_TLS_CA_CERT", str(certs / "ca.crt"))
    monkeypatch.setenv("RAY_TLS_SERVER_CERT", str(certs / "client.crt"))
    monkeypatch.setenv("RAY_TLS_SERVER_KEY", str(certs / "client.key"))

    unnamed = run("status", "--gcs", tls_gcs, "--timeout", "5")
    assert unnamed.exit_code == 1, unnamed.stdout
    # the flag names the server when the environment does not
    flag = run("status", "--gcs", tls_gcs, "--tls-server-name", "gcs.internal")
    assert flag.exit_code == 0, flag.stderr
    assert "head-0" in flag.stdout

    monkeypatch.setenv("RAY_TLS_SERVER_NAME", "gcs.internal")
    tls = TlsConfig.from_env()
    assert tls is not None and tls.server_name == "gcs.internal"
    with RayGcsClient(tls_gcs, tls=tls, timeout=5) as client:
        assert [n.pod for n in client.cluster_state().nodes] == ["head-0"]
    env = run("status", "--gcs", tls_gcs)
    assert env.exit_code == 0, env.stderr
    assert "head-0" in env.stdout

    # without RAY_USE_TLS there is no TLS, and a server name alone is no TLS either
    monkeypatch.delenv("RAY_USE_TLS")
    assert TlsConfig.from_env() is None
    alone = run("status", "--gcs", tls_gcs, "--tls-server-name", "gcs.internal")
    assert alone.exit_code == 2
    assert "--tls-server-name needs TLS" in alone.stderr
