"""Each cluster's own Ray token (activities/ray_tokens.py): where it is looked for, in
KubeRay's order, and how it is cached and read again."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from raysize.activities.k8s_errors import Forbidden, NotFound, Unavailable, from_api_exception
from raysize.activities.ray_errors import RayAuthUnavailable
from raysize.activities.ray_tokens import (
    FallbackScope,
    RayTokens,
    TokenSource,
    kuberay_secret_name,
    source_for,
    token_source,
)


def raycluster(
    name: str = "rc", auth: dict[str, Any] | None = None, env: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head"}]}}}
    }
    if auth is not None:
        spec["authOptions"] = auth
    if env is not None:
        spec["headGroupSpec"]["template"]["spec"]["containers"][0]["env"] = env
    return {"metadata": {"name": name, "namespace": "team"}, "spec": spec}


def test_kuberays_secret_name_is_the_cluster_name_as_check_name_clips_it():
    assert kuberay_secret_name("rc") == "rc"
    long = "a" * 10 + "-" + "b" * 49  # 60 characters: KubeRay keeps the last 50
    assert kuberay_secret_name(long) == "r" + "b" * 49  # a leading '-' becomes 'r'
    assert kuberay_secret_name("x" * 49 + "7" + "y") == "x" * 48 + "7y"
    assert kuberay_secret_name("9" + "z" * 49) == "r" + "z" * 49  # no leading digit
    assert kuberay_secret_name("9" + "z" * 50) == "z" * 50  # the digit was clipped off


def test_where_a_clusters_token_is_in_kuberays_order():
    # no authOptions, nothing in the head: the worker's own token
    assert token_source(raycluster()) is None
    assert token_source(raycluster(auth={"mode": "disabled"})) is None
    # Kubernetes-delegated auth has no Secret: the worker's own token too
    assert token_source(raycluster(auth={"mode": "token", "enableK8sTokenAuth": True})) is None
    # the Secret KubeRay makes, or the one authOptions names
    made = token_source(raycluster("rc", auth={"mode": "token"}))
    assert made == TokenSource("team", "rc", "auth_token", why=made.why if made else "")
    named = token_source(raycluster(auth={"mode": "token", "secretName": "mine"}))
    assert named is not None and (named.secret, named.key) == ("mine", "auth_token")
    # the head container's own RAY_AUTH_TOKEN wins: KubeRay leaves a set one alone
    ref = {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "tok"}}}
    own = token_source(raycluster(auth={"mode": "token"}, env=[ref]))
    assert own is not None and (own.namespace, own.secret, own.key) == ("team", "s", "tok")
    assert "secretKeyRef" in own.describe()
    literal = token_source(raycluster(env=[{"name": "RAY_AUTH_TOKEN", "value": "t0k"}]))
    assert literal is not None and literal.value == "t0k"
    assert "t0k" not in literal.describe()  # never the token itself


def secret(token: str, version: str, key: str = "auth_token") -> dict[str, Any]:
    return {
        "metadata": {"resourceVersion": version},
        "data": {key: base64.b64encode(token.encode()).decode()},
    }


class Secrets:
    """The API server's Secrets, by (namespace, name), and the GETs made of them."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], dict[str, Any] | Exception] = {}
        self.gets = 0

    def read(self, namespace: str, name: str) -> dict[str, Any]:
        self.gets += 1
        item = self.items.get((namespace, name)) or NotFound(f'secrets "{name}" not found')
        if isinstance(item, Exception):
            raise item
        return item


def test_a_token_is_read_once_and_again_only_when_refused():
    api = Secrets()
    api.items[("team", "rc")] = secret("one\n", "5")  # Ray strips the token: so does raysize
    tokens = RayTokens(api.read, fallback="global")
    source = TokenSource("team", "rc")
    assert tokens.token(None) is None  # no token of its own, none named for it: none sent
    assert tokens.token(TokenSource("team", fallback=True)) == "global"
    assert tokens.token(source) == "one" and tokens.token(source) == "one"
    assert api.gets == 1  # cached
    assert tokens.refresh(source) is False  # Ray refused it, but the Secret is as it was
    assert api.gets == 2
    api.items[("team", "rc")] = secret("two", "9")  # rotated
    assert tokens.token(source) == "one"  # the cache holds until Ray refuses it
    assert tokens.refresh(source) is True  # a new resourceVersion: worth asking again
    assert tokens.token(source) == "two" and api.gets == 3
    # a literal token, or the fallback, has nothing to read again
    assert tokens.refresh(None) is False
    assert tokens.refresh(TokenSource("team", fallback=True)) is False
    assert tokens.refresh(TokenSource("team", value="x")) is False
    assert api.gets == 3


def forbidden(ns: str) -> Forbidden:
    body = (
        '{"message": "secrets \\"rc\\" is forbidden: User \\"system:serviceaccount:raysize:'
        'raysize\\" cannot get resource \\"secrets\\" in API group \\"\\" in the namespace '
        f'\\"{ns}\\""}}'
    )
    err = from_api_exception(type("E", (), {"status": 403, "body": body})())
    assert isinstance(err, Forbidden)
    return err


def test_a_secret_that_cannot_be_read_says_what_to_grant_or_create():
    api = Secrets()
    api.items[("team", "rc")] = forbidden("team")
    api.items[("team", "nokey")] = secret("t", "1", key="token")
    api.items[("team", "empty")] = secret("  ", "1")
    api.items[("team", "flaky")] = Unavailable("cannot reach the Kubernetes API")
    tokens = RayTokens(api.read)
    with pytest.raises(RayAuthUnavailable) as refused:
        tokens.token(TokenSource("team", "rc", why="authOptions.mode token"))
    assert "may not `get secrets` in namespace team" in str(refused.value)
    assert "deploy/watched-namespace/role.yaml" in str(refused.value)
    assert refused.value.retryable is False
    with pytest.raises(RayAuthUnavailable, match="does not exist: KubeRay makes it"):
        tokens.token(TokenSource("team", "gone"))
    with pytest.raises(RayAuthUnavailable, match=r"has no key auth_token \(it has: token\)"):
        tokens.token(TokenSource("team", "nokey"))
    with pytest.raises(RayAuthUnavailable, match="the token is empty"):
        tokens.token(TokenSource("team", "empty"))
    with pytest.raises(RayAuthUnavailable) as flaky:
        tokens.token(TokenSource("team", "flaky"))
    assert flaky.value.retryable is True  # the API server may come back


def test_the_workers_own_token_goes_only_where_ray_token_for_names() -> None:
    """#43 item 6: the fallback token was sent to every cluster without one of its own,
    auth or not: any tenant who runs a head pod could read it."""
    mine = FallbackScope.parse("team-a, team-b/train")
    assert mine.allows("team-a", "any") and mine.allows("team-b", "train")
    assert not mine.allows("team-b", "other") and not mine.allows("team-c", "train")
    assert FallbackScope.parse("*").allows("x", "y")
    assert not FallbackScope.parse("").allows("team-a", "x")

    def rc(ns: str, name: str) -> dict[str, Any]:
        return {"metadata": {"namespace": ns, "name": name}, "spec": {}}

    assert source_for(rc("team-c", "x"), mine) is None
    named = source_for(rc("team-a", "x"), mine)
    assert named is not None and named.fallback
    assert "RAYSIZE_RAY_TOKEN_FOR=team-a,team-b/train" in named.describe()
    # a cluster's own token wins, named or not
    own = source_for(raycluster(auth={"mode": "token"}), FallbackScope.parse("*"))
    assert own is not None and not own.fallback
    for bad in ("team a", "a/b/c", "Team", "/x"):
        with pytest.raises(ValueError, match="is not '\\*', a namespace or"):
            FallbackScope.parse(bad)
