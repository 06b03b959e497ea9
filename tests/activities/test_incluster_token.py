"""In a pod, raysize sends the ServiceAccount token the file holds now: the kubelet
rewrites it before 80 % of its life, and the client's own in-cluster loader would keep
sending the old one for up to a minute (past its end when less than a minute is left).
tests/e2e/test_deployed_worker.py shows it on the real server with a rotating kubelet."""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client
from kubernetes.config.incluster_config import InClusterConfigLoader

from raysize.activities.k8s import follow_token_file


def loaded(tmp_path: Path) -> tuple[client.Configuration, Path]:
    """A configuration as `load_incluster_config` makes it, from files in tmp_path."""
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("first")
    ca.write_text("not checked here")
    cfg = client.Configuration()
    environ = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    InClusterConfigLoader(str(token), str(ca), environ=environ).load_and_set(cfg)
    return cfg, token


def rotate(token: Path, value: str) -> None:
    """As the kubelet writes it: a new file swapped in at once."""
    tmp = token.with_name(".new")
    tmp.write_text(value)
    os.replace(tmp, token)


def test_a_rotated_token_is_sent_at_once(tmp_path: Path) -> None:
    cfg, token = loaded(tmp_path)
    follow_token_file(cfg, token)
    assert cfg.get_api_key_with_prefix("BearerToken") == "bearer first"
    rotate(token, "second\n")
    assert cfg.get_api_key_with_prefix("BearerToken") == "bearer second"
    rotate(token, "third")
    assert cfg.get_api_key_with_prefix("BearerToken") == "bearer third"


def test_the_clients_own_loader_keeps_the_old_token_for_a_minute(tmp_path: Path) -> None:
    """Why follow_token_file exists: without it the rotated token is not sent."""
    cfg, token = loaded(tmp_path)
    assert cfg.get_api_key_with_prefix("BearerToken") == "bearer first"
    rotate(token, "second")
    assert cfg.get_api_key_with_prefix("BearerToken") == "bearer first"


def test_a_token_file_mid_swap_or_empty_keeps_the_token_it_had(tmp_path: Path) -> None:
    cfg, token = loaded(tmp_path)
    follow_token_file(cfg, token)
    assert cfg.get_api_key_with_prefix("BearerToken") == "bearer first"
    token.unlink()
    assert cfg.get_api_key_with_prefix("BearerToken") == "bearer first"
    token.write_text("")
    assert cfg.get_api_key_with_prefix("BearerToken") == "bearer first"
    rotate(token, "second")
    assert cfg.get_api_key_with_prefix("BearerToken") == "bearer second"
