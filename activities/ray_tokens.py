"""Each Ray cluster's own auth token, read from its Kubernetes Secret.

KubeRay 1.5+ gives a RayCluster with `spec.authOptions.mode: token` a token of its own
(docs/design/ray-protocol.md §3(e)): a Secret named after the cluster (`authOptions.secretName`
when set), key `auth_token`, which it puts in every Ray container as `RAY_AUTH_TOKEN`
through a `secretKeyRef`. A head container that sets `RAY_AUTH_TOKEN` itself wins (KubeRay
leaves it alone), so that is looked at first. A cluster with neither gets the worker's
own token (`RAYSIZE_RAY_TOKEN`, `RAY_AUTH_TOKEN`, `RAY_AUTH_TOKEN_PATH`: the fallback) only
where `RAYSIZE_RAY_TOKEN_FOR` says (`FallbackScope`), else no token: the fallback is a
secret of the platform, and a tenant who runs a head pod (or a GCS of their own at its
address) would see whatever token raysize sends it.

`token_source` is pure (the RayCluster → where its token is); `RayTokens` reads the
Secrets with `get` only (RBAC cannot narrow `list`/`watch` to a name), caches each with
its resourceVersion, and `refresh` re-reads one when Ray refuses the token it holds. A
token is never logged nor put in an error message. Reading Secrets is an opt-in grant
(deploy/components/ray-token-secrets): refused (403), the cluster's loop is told
(non-retryable) every time, and the worker's log once per Secret, with the fix.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Final

from raysize.activities.k8s_errors import Forbidden, KubeError, NotFound
from raysize.activities.ray_errors import RayAuthUnavailable

Obj = dict[str, Any]
log = logging.getLogger("raysize.activities")

TOKEN_ENV: Final = "RAY_AUTH_TOKEN"
SECRET_KEY: Final = "auth_token"  # KubeRay's RAY_AUTH_TOKEN_SECRET_KEY
_MAX_NAME: Final = 50  # KubeRay's utils.CheckName clips names to their last 50 characters


def kuberay_secret_name(cluster: str) -> str:
    """The name KubeRay gives a RayCluster's auth Secret (`utils.CheckName(name)`): the
    last 50 characters, a leading digit or punctuation mark replaced by `r`."""
    name = cluster[-_MAX_NAME:] if len(cluster) > _MAX_NAME else cluster
    if name and name[0].isdigit():
        name = "r" + name[1:]
    if name and not name[0].isalnum():
        name = "r" + name[1:]
    return name


@dataclass(frozen=True)
class TokenSource:
    """Where a cluster's token is: a Secret's key, or (`value`) the head's env itself.
    `why` says what named it, for messages."""

    namespace: str
    secret: str = ""
    key: str = SECRET_KEY
    value: str | None = None  # the head container's literal RAY_AUTH_TOKEN
    why: str = ""
    fallback: bool = False  # the worker's own token, which RAYSIZE_RAY_TOKEN_FOR sends here
    # the RayCluster that names it, for messages (two clusters may name one Secret)
    cluster: str = field(default="", compare=False)

    def describe(self) -> str:
        if self.fallback:
            return f"the worker's own token (RAYSIZE_RAY_TOKEN; {self.why})"
        if self.value is not None:
            return f"the literal {TOKEN_ENV} of the head container ({self.why})"
        return f"Secret {self.namespace}/{self.secret}, key {self.key} ({self.why})"


def _head_container(raycluster: Obj) -> Obj:
    spec = raycluster.get("spec") or {}
    template = (spec.get("headGroupSpec") or {}).get("template") or {}
    containers = (template.get("spec") or {}).get("containers") or []
    # KubeRay's RayContainerIndex: the Ray container is the first
    return containers[0] if containers and isinstance(containers[0], dict) else {}


def token_source(raycluster: Obj) -> TokenSource | None:
    """Where the RayCluster's Ray token is, as its pods get it; None: it has none of its
    own (no `authOptions` token mode, or Kubernetes-delegated auth), use the fallback."""
    meta = raycluster.get("metadata") or {}
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    for env in _head_container(raycluster).get("env") or []:
        if not isinstance(env, dict) or env.get("name") != TOKEN_ENV:
            continue
        ref = (env.get("valueFrom") or {}).get("secretKeyRef") or {}
        if ref.get("name"):
            why = f"the head container's {TOKEN_ENV} secretKeyRef"
            key = str(ref.get("key") or SECRET_KEY)
            return TokenSource(ns, str(ref["name"]), key, why=why, cluster=name)
        if env.get("value"):
            return TokenSource(ns, value=str(env["value"]), why="spec.headGroupSpec", cluster=name)
        break  # set some other way (a fieldRef, say): not one raysize can follow
    auth = (raycluster.get("spec") or {}).get("authOptions") or {}
    if auth.get("mode") != "token" or auth.get("enableK8sTokenAuth") is True:
        return None
    if auth.get("secretName"):
        why = "authOptions.secretName"
        return TokenSource(ns, str(auth["secretName"]), why=why, cluster=name)
    why = "authOptions.mode token: the Secret KubeRay made"
    return TokenSource(ns, kuberay_secret_name(name), why=why, cluster=name)


@dataclass(frozen=True)
class FallbackScope:
    """Where the worker's own Ray token may be sent (`RAYSIZE_RAY_TOKEN_FOR`): `*` (every
    cluster without a token of its own: one tenant), a namespace, or `namespace/cluster`.
    Empty: nowhere."""

    entries: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> FallbackScope:
        """From `RAYSIZE_RAY_TOKEN_FOR`'s comma-separated list; a ValueError names the
        entry that is neither `*`, a namespace nor `namespace/cluster`."""
        entries = tuple(e.strip() for e in text.split(",") if e.strip())
        for e in entries:
            parts = e.split("/")
            if e == "*" or (len(parts) in (1, 2) and all(_DNS_NAME.fullmatch(p) for p in parts)):
                continue
            raise ValueError(
                f"{e!r} is not '*', a namespace or <namespace>/<raycluster> (e.g. "
                "'team-a,team-b/train-1')"
            )
        return cls(entries)

    def allows(self, namespace: str, cluster: str) -> bool:
        return any(e in ("*", namespace, f"{namespace}/{cluster}") for e in self.entries)

    def __str__(self) -> str:
        return ",".join(self.entries)


_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def source_for(raycluster: Obj, scope: FallbackScope) -> TokenSource | None:
    """Where the token sent to the RayCluster's GCS comes from: its own (`token_source`),
    else the worker's own where `scope` allows it; None: no token is sent."""
    own = token_source(raycluster)
    if own is not None:
        return own
    meta = raycluster.get("metadata") or {}
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    if scope.allows(ns, name):
        return TokenSource(ns, fallback=True, why=f"RAYSIZE_RAY_TOKEN_FOR={scope}")
    return None


def grant(source: TokenSource) -> str:
    """How to let raysize read the Secret at `source`: the opt-in grant of
    docs/security.md ("Ray token Secrets")."""
    return (
        "Grant it: add the component deploy/components/ray-token-secrets to the folder of "
        f"namespace {source.namespace} (the Role of deploy/watched-namespace/role.yaml does "
        "not grant it), or in Helm set rayTokenSecrets.enabled=true (and, if you set "
        f"rayTokenSecrets.names, add {source.secret} to it); docs/security.md, Ray token Secrets"
    )


def secret_token(secret: Obj, source: TokenSource) -> str:
    """The token in a Secret as the API returns it (`data`: base64), stripped as Ray
    strips it; a clear error when the key is missing or empty."""
    data = secret.get("data") or {}
    if source.key not in data:
        keys = ", ".join(sorted(data)) or "none"
        raise RayAuthUnavailable(
            f"{source.describe()}: the Secret has no key {source.key} (it has: {keys}); put the "
            "Ray token under that key",
            retryable=False,
        )
    try:
        token = base64.b64decode(str(data[source.key]), validate=True).decode().strip()
    except (binascii.Error, UnicodeDecodeError):
        raise RayAuthUnavailable(
            f"{source.describe()}: the value is not a text token", retryable=False
        ) from None
    if not token:
        raise RayAuthUnavailable(
            f"{source.describe()}: the token is empty; put the Ray token there", retryable=False
        )
    return token


class RayTokens:
    """Each cluster's token, from its Secret (read with `get`, cached with its
    resourceVersion), else `fallback` where `source_for` allows it. Thread-safe:
    activities run in threads."""

    def __init__(self, read_secret: Any, fallback: str | None = None) -> None:
        # read_secret(namespace, name) -> the Secret (a dict); `Kube.read_secret`
        self._read = read_secret
        self.fallback = fallback
        self._lock = threading.Lock()
        # (namespace, Secret) → (resourceVersion, the Secret's `data` alone): `forget`
        # drops one when no cluster this worker knows names it any more
        self._cache: dict[tuple[str, str], tuple[str, Obj]] = {}
        self.reads = 0  # Secret GETs made (tests count them)
        # (namespace, Secret) whose refusal (403) was logged: said once, until it is read
        self._said: set[tuple[str, str]] = set()

    def token(self, source: TokenSource | None) -> str | None:
        """The token to send to the cluster whose token is at `source` (`source_for`):
        cached; None (no token) for None."""
        if source is None:
            return None
        if source.fallback:
            return self.fallback
        if source.value is not None:
            return source.value.strip()
        with self._lock:
            cached = self._cache.get((source.namespace, source.secret))
        if cached is None:
            cached = self._get(source)
        return secret_token(cached[1], source)

    def refresh(self, source: TokenSource | None) -> bool:
        """Read the Secret again (Ray refused the token held): True when it changed
        since it was cached (a new resourceVersion), so a call is worth repeating."""
        if source is None or source.value is not None or source.fallback:
            return False
        with self._lock:
            before = self._cache.get((source.namespace, source.secret))
        after = self._get(source)
        return before is None or after[0] != before[0]

    def _get(self, source: TokenSource) -> tuple[str, Obj]:
        try:
            secret = self._read(source.namespace, source.secret)
        except Forbidden as exc:
            self._refused(source)
            raise RayAuthUnavailable(
                f"cannot read the Ray token at {source.describe()}: raysize may not `get "
                f"secrets` in namespace {source.namespace} ({exc.message}). {grant(source)}",
                retryable=False,
            ) from None
        except NotFound:
            raise RayAuthUnavailable(
                f"the Ray token's {source.describe()} does not exist: KubeRay makes it for "
                "authOptions.mode token; with authOptions.secretName or a secretKeyRef, create "
                "that Secret",
                retryable=False,
            ) from None
        except KubeError as exc:
            raise RayAuthUnavailable(
                f"cannot read the Ray token at {source.describe()}: {exc.message}",
                retryable=exc.retryable,
            ) from None
        self.reads += 1
        with self._lock:
            self._said.discard((source.namespace, source.secret))  # readable again
        version = str((secret.get("metadata") or {}).get("resourceVersion") or "")
        # its data only: a Secret's metadata (managedFields, annotations) is most of it
        entry: tuple[str, Obj] = (version, {"data": dict(secret.get("data") or {})})
        with self._lock:
            self._cache[(source.namespace, source.secret)] = entry
        return entry

    def _refused(self, source: TokenSource) -> None:
        """Say once per Secret, as a warning, that RBAC refuses it: which RayCluster, which
        Secret, and how to grant it. The refusal itself goes to the loop as a
        non-retryable `RayAuthUnavailable` each time (the loop backs off and tries again
        later, as for any failed observe; the worker goes on with every other cluster)."""
        key = (source.namespace, source.secret)
        with self._lock:
            if key in self._said:
                return
            self._said.add(key)
        who = "a RayCluster"
        if source.cluster:
            who = f"RayCluster {source.namespace}/{source.cluster}"
        log.warning(
            "%s uses Ray token auth, and raysize may not read its token (403 on Secret %s/%s, "
            "key %s: %s); raysize leaves that cluster alone until it may. %s",
            who,
            source.namespace,
            source.secret,
            source.key,
            source.why,
            grant(source),
        )

    def forget(self, namespace: str, secret: str) -> None:
        """Drop a Secret's cached copy (no cluster of this worker names it now: deleted,
        or its token moved elsewhere); read again if it is named again."""
        with self._lock:
            self._cache.pop((namespace, secret), None)

    def cached(self) -> int:
        """Secrets held (`bench.tenant_churn_bench`, the tests)."""
        with self._lock:
            return len(self._cache)
