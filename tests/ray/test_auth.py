"""Token auth against a real Ray 2.60 head started with RAY_AUTH_MODE=token."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raysize.activities.ray_gcs import RayGcsClient, RayUnauthenticated
from raysize.sandbox.localray import LocalRayCluster
from raysize.worker.cli import app
from tests.ray.conftest import short_tmp


@pytest.fixture(scope="module")
def secured() -> Iterator[LocalRayCluster]:
    root = short_tmp()
    ray = LocalRayCluster(root=root, token=secrets.token_hex(32))
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
