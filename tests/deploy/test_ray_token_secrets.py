"""Reading Ray token Secrets is opt-in (deploy/components/ray-token-secrets, the chart's
rayTokenSecrets): a worker without the grant works on every other cluster, and for a
cluster whose token it may not read says so once, naming the RayCluster, the Secret and
the grant, and leaves that cluster's loop to back off (a non-retryable refusal each time,
never a crash). The real API server's refusal: tests/deploy/test_profiles_real.py."""

from __future__ import annotations

import base64
import logging
from typing import Any

import pytest

from raysize.activities.k8s_errors import Forbidden, from_api_exception
from raysize.activities.ray_errors import RayAuthUnavailable
from raysize.activities.ray_tokens import FallbackScope, RayTokens, source_for, token_source


def forbidden(ns: str, name: str) -> Forbidden:
    body = (
        f'{{"message": "secrets \\"{name}\\" is forbidden: User \\"system:serviceaccount:'
        'raysize:raysize\\" cannot get resource \\"secrets\\" in API group \\"\\" in the '
        f'namespace \\"{ns}\\""}}'
    )
    err = from_api_exception(type("E", (), {"status": 403, "body": body})())
    assert isinstance(err, Forbidden)
    return err


def raycluster(ns: str, name: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": ns, "name": name},
        "spec": {
            "authOptions": {"mode": "token"},
            "headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head"}]}}},
        },
    }


class Secrets:
    """`Kube.read_secret` of a namespace whose Secrets raysize may not read, until granted."""

    def __init__(self) -> None:
        self.granted = False
        self.gets = 0

    def read(self, ns: str, name: str) -> dict[str, Any]:
        self.gets += 1
        if not self.granted:
            raise forbidden(ns, name)
        token = base64.b64encode(b"t0k").decode()
        return {"metadata": {"resourceVersion": "1"}, "data": {"auth_token": token}}


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == "raysize.activities"
    ]


def test_a_refused_secret_is_said_once_with_the_cluster_the_secret_and_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="raysize.activities")
    api = Secrets()
    tokens = RayTokens(api.read, fallback="the-workers-own")
    source = token_source(raycluster("team-a", "train-1"))
    assert source is not None and source.cluster == "train-1"
    for _ in range(3):  # the loop's observes, backing off: refused each time, never retried
        with pytest.raises(RayAuthUnavailable) as refused:
            tokens.token(source)
        assert refused.value.retryable is False
        assert "may not `get secrets` in namespace team-a" in str(refused.value)
        assert "deploy/components/ray-token-secrets" in str(refused.value)
    assert api.gets == 3  # each observe asks again: a grant added later is seen at once
    (said,) = warnings(caplog)  # but the log says it once
    assert "RayCluster team-a/train-1 uses Ray token auth" in said
    assert "403 on Secret team-a/train-1, key auth_token" in said
    assert "deploy/components/ray-token-secrets" in said and "rayTokenSecrets" in said
    assert "leaves that cluster alone" in said
    assert "the-workers-own" not in said  # never the fallback token instead, nor in a message
    # another cluster's Secret is its own warning
    other = token_source(raycluster("team-a", "train-2"))
    with pytest.raises(RayAuthUnavailable):
        tokens.token(other)
    assert len(warnings(caplog)) == 2 and "team-a/train-2" in warnings(caplog)[1]
    # granted: read; refused again later (the grant removed): said again, once
    api.granted = True
    assert tokens.token(source) == "t0k"
    api.granted = False
    tokens.forget("team-a", "train-1")
    for _ in range(2):
        with pytest.raises(RayAuthUnavailable):
            tokens.token(source)
    assert len(warnings(caplog)) == 3


def test_a_cluster_whose_secret_is_refused_is_not_sent_the_fallback_token() -> None:
    """Without the grant, a token-auth cluster's token is still its own Secret: the
    worker's token (RAYSIZE_RAY_TOKEN) is never sent in its stead, even where
    RAYSIZE_RAY_TOKEN_FOR names the cluster."""
    source = source_for(raycluster("team-a", "train-1"), FallbackScope.parse("*"))
    assert source is not None and not source.fallback and source.secret == "train-1"
