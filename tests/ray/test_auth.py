"""Token auth against a real Ray 2.60 head started with RAY_AUTH_MODE=token."""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from temporalio.testing import ActivityEnvironment
from typer.testing import CliRunner

from raysize.activities.cluster import ClusterActivities, RaySettings
from raysize.activities.k8s import Kube
from raysize.activities.ray_gcs import RayGcsClient, RayUnauthenticated
from raysize.sandbox.cluster import Sandbox, SandboxConfig
from raysize.sandbox.localray import LocalRayCluster
from raysize.worker.cli import app
from raysize.workflows.contracts import ObserveInput
from tests.ray.conftest import short_tmp
from tests.sandbox.test_ray_tokens import token_cluster


@pytest.fixture(scope="module")
def secured() -> Iterator[LocalRayCluster]:
    root = short_tmp()
    # a token as KubeRay makes them for authOptions (base64 of 32 random bytes: '+', '/', '=')
    ray = LocalRayCluster(root=root, token=base64.b64encode(secrets.token_bytes(32)).decode())
    try:
        ray.start_head()
        ray.wait_alive(["head-0"])
        yield ray
    finally:
        ray.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_the_right_token_from_argument_env_or_file_is_accepted(
    secured: LocalRayCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert secured.token
    with RayGcsClient(secured.address, token=secured.token) as client:
        assert [n.pod for n in client.cluster_state().nodes] == ["head-0"]

    monkeypatch.setenv("RAY_AUTH_TOKEN", secured.token)
    with RayGcsClient(secured.address) as client:
        assert client.nodes()[0].is_head

    monkeypatch.delenv("RAY_AUTH_TOKEN")
    token_file = tmp_path / "auth_token"
    token_file.write_text(secured.token + "\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token_file))
    with RayGcsClient(secured.address) as client:
        assert client.cluster_state().nodes


def test_a_missing_token_is_unauthenticated_with_a_hint(secured: LocalRayCluster) -> None:
    with RayGcsClient(secured.address) as client, pytest.raises(RayUnauthenticated) as caught:
        client.cluster_state()
    assert "no token was sent; set RAY_AUTH_TOKEN" in str(caught.value)
    assert caught.value.retryable is False


def test_a_wrong_token_is_unauthenticated_for_reads_and_resizes(secured: LocalRayCluster) -> None:
    with RayGcsClient(secured.address, token=secrets.token_hex(32)) as client:
        with pytest.raises(RayUnauthenticated, match="the token sent is wrong"):
            client.cluster_state()
        # Refused for the token, before the GCS looks for the (unknown) node.
        with pytest.raises(RayUnauthenticated):
            client.resize_raylet(os.urandom(28).hex(), 1, 1e9)


def test_the_cli_reads_the_token_from_a_file(secured: LocalRayCluster, tmp_path: Path) -> None:
    assert secured.token
    (tmp_path / "token").write_text(secured.token + "\n")
    result = CliRunner().invoke(
        app, ["ray", "status", "--gcs", secured.address, "--token-file", str(tmp_path / "token")]
    )
    assert result.exit_code == 0, result.stderr
    assert "head-0" in result.stdout


def test_the_cli_says_so_in_one_line(secured: LocalRayCluster, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("not-the-token")
    result = CliRunner().invoke(
        app, ["ray", "status", "--gcs", secured.address, "--token-file", str(tmp_path / "token")]
    )
    assert result.exit_code == 1
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: read cluster state:") and "token sent is wrong" in line


def test_a_clusters_own_token_from_its_secret_is_what_a_real_ray_accepts(
    secured: LocalRayCluster, tmp_path: Path
) -> None:
    """The observe of a RayCluster with `authOptions.secretName`: the worker's own token
    is wrong for this Ray, the one in the cluster's Secret is right (#28 item 2)."""
    assert secured.token
    sb = Sandbox(SandboxConfig()).start()
    try:
        api = config.new_client_from_config(config_file=str(sb.write_kubeconfig(tmp_path / "kc")))
        client.CoreV1Api(api).create_namespaced_secret(
            "default",
            {"metadata": {"name": "ray-token"}, "stringData": {"auth_token": secured.token}},
        )
        rc = token_cluster("secured", auth={"mode": "token", "secretName": "ray-token"})
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "ray.io", "v1", "default", "rayclusters", rc
        )
        acts = ClusterActivities(kube=Kube(api), ray=RaySettings(token="not-this-rays-token"))
        try:
            inp = ObserveInput(namespace="default", cluster="secured", gcs_address=secured.address)
            seen = asyncio.run(ActivityEnvironment().run(acts.observe, inp))
            assert seen.snapshot is not None and seen.gcs_version  # Ray's state, read
        finally:
            acts.close()
            api.close()
    finally:
        sb.close()
