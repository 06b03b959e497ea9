"""`raysize doctor`: check, before trusting raysize with a cluster, that what the worker
needs is there, as the worker would see it (the same RAYSIZE_* settings, kubeconfig or
in-cluster ServiceAccount, Temporal address and credentials, Ray token and TLS).

One line per check, `ok`, `warn` or `FAIL`, and exit 1 when any check failed. Every check
has a deadline (`--timeout`), so an address that never answers is a FAIL, not a hang.
Doctor writes nothing: no search attribute is registered, no object created (an access
review asks the API server, and is not stored)."""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, TypeVar

import typer
from kubernetes import client as k8s

from raysize.activities.cluster import RaySettings
from raysize.activities.discovery import is_managed
from raysize.activities.k8s import Kube, KubeconfigError
from raysize.activities.k8s_errors import KubeError, Unavailable
from raysize.activities.k8s_objects import Obj, gcs_address
from raysize.activities.ray_errors import RayError
from raysize.activities.ray_gcs import RayGcsClient
from raysize.activities.ray_tokens import RayTokens, source_for
from raysize.worker.cli_common import OPS_PANEL
from raysize.worker.cli_ops import _settings
from raysize.worker.run import ray_settings
from raysize.worker.settings import Settings
from raysize.worker.temporal import (
    SearchAttributesUnknown,
    SetupError,
    connect,
    ensure_search_attributes,
)
from raysize.workflows.ippr import IPPR_ANNOTATION, NOT_REQUIRED
from raysize.workflows.model import HEAD_GROUP
from raysize.workflows.pod_template import template_container

T = TypeVar("T")

MIN_KUBERNETES = (1, 33)  # the pods/resize subresource (InPlacePodVerticalScaling beta)
MIN_RAY = (2, 60)  # the GCS calls raysize makes (docs/design/ray-protocol.md)
# KubeRay writes it on a head pod it made with an upgrade strategy, and on the RayClusters
# of a RayService
KUBERAY_VERSION_ANNOTATION = "ray.io/kuberay-version"
KUBERAY_TESTED = "v1.6.1"
DEFAULT_TIMEOUT_S = 5.0


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Check:
    status: Status
    check: str
    detail: str

    def line(self) -> str:
        return f"{self.status.value:<4}  {self.check}: {self.detail}"

    def to_json(self) -> dict[str, str]:
        return {"status": self.status.value, "check": self.check, "detail": self.detail}


@dataclass(frozen=True)
class Permission:
    """One verb on one resource ("pods/resize" for a subresource) of an API group."""

    group: str
    resource: str
    verb: str
    name: str = ""  # one object of that name only ('': any)

    def __str__(self) -> str:
        where = f".{self.group}" if self.group else ""
        named = f" {self.name}" if self.name else ""
        return f"{self.verb} {self.resource}{where}{named}"


# What the worker does, each in every namespace it watches. deploy/watched-namespace's Role
# and deploy/components/cluster-wide's ClusterRole grant exactly these
# (tests/worker/test_cli_doctor.py checks both files against this list).
WORKER_PERMISSIONS: tuple[Permission, ...] = (
    *(Permission("", "pods", v) for v in ("get", "list", "watch", "patch")),
    Permission("", "pods/resize", "patch"),
    Permission("", "events", "create"),
    *(Permission("ray.io", "rayclusters", v) for v in ("get", "list", "watch", "patch")),
)
# each Ray cluster's own token (activities/ray_tokens.py), a grant of its own
# (deploy/components/ray-token-secrets): without it a cluster with token auth is not reached
RAY_TOKEN_PERMISSIONS: tuple[Permission, ...] = (Permission("", "secrets", "get"),)
# launching at size (Kube.write_launch_sizes), in every namespace it watches: without them
# new pods start at their template's size and grow once they run (a warning)
LAUNCH_SIZE_PERMISSIONS: tuple[Permission, ...] = (
    Permission("", "configmaps", "create"),
    *(Permission("", "configmaps", v, "raysize-launch-sizes") for v in ("get", "patch")),
)
# the nodes' room (activities/node_room.py), in every namespace: without them grows are
# planned without it (a warning: raysize works, and the kubelet defers what does not fit)
NODE_ROOM_PERMISSIONS: tuple[Permission, ...] = (
    *(Permission("", "nodes", v) for v in ("list", "watch")),
    *(Permission("", "pods", v) for v in ("list", "watch")),
)


def _version(text: str) -> tuple[int, int] | None:
    """(major, minor) of "v1.36.3", "1.33+", "2.60.0", else None."""
    m = re.match(r"v?(\d+)\.(\d+)", text.strip())
    return (int(m[1]), int(m[2])) if m else None


def _where(namespaces: list[str]) -> str:
    return ", ".join(namespaces) if namespaces else "every namespace"


class Doctor:
    """The checks, in the order they are shown. Blocking calls run in threads of their own
    pool, each bounded by `timeout_s`; a thread stuck past it is left behind, not waited
    for (the process leaves with os._exit)."""

    def __init__(self, settings: Settings, timeout_s: float) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self.checks: list[Check] = []
        self.managed: list[Obj] = []  # the RayClusters raysize manages (discovery's rule)
        self.listing: list[Check] = []  # why some could not be listed
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="raysize-doctor")

    def add(self, status: Status, check: str, detail: str) -> None:
        self.checks.append(Check(status, check, detail))

    async def blocking(self, fn: Callable[[], T], what: str) -> T:
        """fn() in a thread, or Unavailable naming `what` once the deadline passes."""
        loop = asyncio.get_running_loop()
        try:
            # the call carries its own timeout; this one is the last word
            return await asyncio.wait_for(loop.run_in_executor(self.pool, fn), self.timeout_s + 1)
        except TimeoutError:
            raise Unavailable(f"{what} did not answer within {self.timeout_s:g} s") from None

    async def run(self) -> list[Check]:
        try:
            kube = await self.kubernetes()
            namespaces = self.settings.namespace_list()
            if kube is not None:
                await self.list_clusters(kube, namespaces)
                await self.kuberay(kube, namespaces)
                await self.rbac(kube, namespaces)
            await self.temporal()
            ray = self.ray()
            if kube is not None and ray is not None:
                await self.clusters(kube, namespaces, ray)
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)
        return self.checks

    # --- Kubernetes ---------------------------------------------------------------------
    async def kubernetes(self) -> Kube | None:
        path = self.settings.kubeconfig
        try:
            kube = Kube.from_kubeconfig(str(path) if path else None, timeout_s=self.timeout_s)
        except KubeconfigError as exc:
            self.add(Status.FAIL, "kubernetes", str(exc))
            return None
        try:
            info = await self.blocking(
                lambda: kube.call("version", k8s.VersionApi(kube.api).get_code),
                f"the Kubernetes API at {kube.host}",
            )
            core = await self.blocking(
                lambda: kube.call("APIResourceList", kube.core.get_api_resources),
                f"the Kubernetes API at {kube.host}",
            )
        except KubeError as exc:
            self.add(Status.FAIL, "kubernetes", str(exc))
            return None
        shown = str(info.git_version)
        version = _version(f"{info.major}.{info.minor}".replace("+", ""))
        served = "pods/resize" in {r.name for r in core.resources or []}
        if version is not None and version < MIN_KUBERNETES:
            self.add(
                Status.FAIL,
                "kubernetes",
                f"{shown} at {kube.host} is older than 1.33: raysize resizes pods in place "
                "through pods/resize, which needs Kubernetes 1.33 or newer (upgrade the cluster)",
            )
        elif not served:
            self.add(
                Status.FAIL,
                "kubernetes",
                f"{shown} at {kube.host} does not serve pods/resize: turn on the "
                "InPlacePodVerticalScaling feature gate (on by default from 1.33) on the API "
                "server and the kubelets",
            )
        else:
            self.add(Status.OK, "kubernetes", f"{shown} at {kube.host}, pods/resize served")
        return kube

    async def kuberay(self, kube: Kube, namespaces: list[str]) -> None:
        custom = kube.custom
        try:
            groups = await self.blocking(
                lambda: kube.call("APIGroupList", k8s.ApisApi(kube.api).get_api_versions),
                f"the Kubernetes API at {kube.host}",
            )
        except KubeError as exc:
            self.add(Status.FAIL, "kuberay", str(exc))
            return
        ray = next((g for g in groups.groups or [] if g.name == "ray.io"), None)
        versions = [v.version for v in (ray.versions if ray else None) or []]
        if "v1" not in versions:
            has = f" (ray.io serves {', '.join(versions)} only)" if versions else ""
            self.add(
                Status.FAIL,
                "kuberay",
                f"the RayCluster CRD rayclusters.ray.io/v1 is not installed{has}: install "
                f"KubeRay (raysize is tested with {KUBERAY_TESTED}; helm install "
                "kuberay-operator kuberay/kuberay-operator)",
            )
            return
        try:
            listed = await self.blocking(
                lambda: kube.call("APIResourceList", custom.get_api_resources, "ray.io", "v1"),
                f"the Kubernetes API at {kube.host}",
            )
        except KubeError as exc:
            self.add(Status.FAIL, "kuberay", str(exc))
            return
        names = {r.name for r in getattr(listed, "resources", None) or []}
        if "rayclusters" not in names:
            self.add(
                Status.FAIL,
                "kuberay",
                "ray.io/v1 serves no rayclusters: install KubeRay's RayCluster CRD "
                "(helm install kuberay-operator kuberay/kuberay-operator)",
            )
            return
        served = "rayclusters.ray.io/v1 served"
        operator = await self.operator_versions(kube, namespaces)
        if operator:
            self.add(Status.OK, "kuberay", f"{served}, operator {', '.join(operator)}")
        else:
            self.add(
                Status.WARN,
                "kuberay",
                f"{served}; the operator's version is unknown (no managed RayCluster or head "
                f"pod in {_where(namespaces)} carries {KUBERAY_VERSION_ANNOTATION}): raysize "
                f"is tested with KubeRay {KUBERAY_TESTED}",
            )

    async def operator_versions(self, kube: Kube, namespaces: list[str]) -> list[str]:
        """The KubeRay versions the managed RayClusters and the head pods of the watched
        namespaces say they were made by."""
        found: set[str] = set()
        for rc in self.managed:
            version = ((rc.get("metadata") or {}).get("annotations") or {}).get(
                KUBERAY_VERSION_ANNOTATION
            )
            if version:
                found.add(str(version))
        for ns in namespaces or [""]:

            def heads(ns: str = ns) -> Any:
                selector = "ray.io/node-type=head"
                if ns:
                    return kube.call(
                        "Pod", kube.core.list_namespaced_pod, ns, label_selector=selector
                    )
                return kube.call(
                    "Pod", kube.core.list_pod_for_all_namespaces, label_selector=selector
                )

            try:
                pods = await self.blocking(heads, f"the Kubernetes API at {kube.host}")
            except KubeError:  # the RBAC check says what is missing
                continue
            for pod in pods.items or []:
                version = (pod.metadata.annotations or {}).get(KUBERAY_VERSION_ANNOTATION)
                if version:
                    found.add(version)
        return sorted(found)

    async def rbac(self, kube: Kube, namespaces: list[str]) -> None:
        authz = k8s.AuthorizationV1Api(kube.api)

        def review(p: Permission, ns: str) -> bool:
            resource, _, sub = p.resource.partition("/")
            body = k8s.V1SelfSubjectAccessReview(
                spec=k8s.V1SelfSubjectAccessReviewSpec(
                    resource_attributes=k8s.V1ResourceAttributes(
                        group=p.group,
                        resource=resource,
                        subresource=sub or None,
                        verb=p.verb,
                        namespace=ns or None,
                        name=p.name or None,
                    )
                )
            )
            reply = kube.call(
                "SelfSubjectAccessReview", authz.create_self_subject_access_review, body
            )
            return reply.status is not None and bool(reply.status.allowed)

        async def missing_of(permissions: tuple[Permission, ...], ns: str) -> list[str]:
            """Those of `permissions` the server says the worker lacks in `ns` ('': in
            every namespace); raises KubeError when it cannot tell."""
            allowed = await asyncio.gather(
                *(
                    self.blocking(
                        functools.partial(review, p, ns), f"the Kubernetes API at {kube.host}"
                    )
                    for p in permissions
                )
            )
            return [str(p) for p, yes in zip(permissions, allowed, strict=True) if not yes]

        for ns in namespaces or [""]:
            where = f"namespace {ns}" if ns else "every namespace (cluster-wide)"
            try:
                missing = await missing_of(WORKER_PERMISSIONS, ns)
            except KubeError as exc:
                self.add(Status.FAIL, "rbac", f"{where}: {exc}")
                continue
            if missing:
                grant = (
                    f"apply deploy/watched-namespace in {ns} (or a Role with these rules)"
                    if ns
                    else "apply deploy/components/cluster-wide (or set RAYSIZE_NAMESPACES to "
                    "the namespaces raysize has a Role in)"
                )
                self.add(Status.FAIL, "rbac", f"{where}: may not {', '.join(missing)}: {grant}")
            else:
                self.add(
                    Status.OK,
                    "rbac",
                    f"{where}: all {len(WORKER_PERMISSIONS)} permissions the worker needs",
                )
        try:
            missing = await missing_of(NODE_ROOM_PERMISSIONS, "")
        except KubeError as exc:
            self.add(Status.WARN, "node room", str(exc))
            return
        if missing:
            self.add(
                Status.WARN,
                "node room",
                f"may not {', '.join(missing)} in every namespace: grows are planned "
                "without the nodes' room (a grow its node cannot take is deferred by the "
                "kubelet); apply deploy/components/node-room (Helm: nodeRoom.enabled=true)",
            )
        else:
            self.add(Status.OK, "node room", "may read nodes and pods in every namespace")
        await self._optional_grant(
            missing_of,
            namespaces,
            "ray tokens",
            RAY_TOKEN_PERMISSIONS,
            "the RayClusters there whose Ray token is in a Secret are not reached; apply "
            "deploy/components/ray-token-secrets (Helm: rayTokenSecrets.enabled=true)",
            "may read the Ray token Secrets of its RayClusters",
        )
        if self.settings.launch_at_size:
            await self._optional_grant(
                missing_of,
                namespaces,
                "launch size",
                LAUNCH_SIZE_PERMISSIONS,
                "new pods start at their template's size and grow once they run; grant it "
                "(deploy/ does) or set RAYSIZE_LAUNCH_AT_SIZE=false",
                "may write the size new pods start at",
            )

    async def _optional_grant(
        self,
        missing_of: Callable[[tuple[Permission, ...], str], Awaitable[list[str]]],
        namespaces: list[str],
        check: str,
        permissions: tuple[Permission, ...],
        without: str,
        ok: str,
    ) -> None:
        """A grant raysize works without, in each watched namespace: WARN, saying what is
        lost, when any of `permissions` is missing."""
        for ns in namespaces or [""]:
            where = f"namespace {ns}" if ns else "every namespace (cluster-wide)"
            try:
                missing = await missing_of(permissions, ns)
            except KubeError as exc:
                self.add(Status.WARN, check, f"{where}: {exc}")
                continue
            if missing:
                self.add(Status.WARN, check, f"{where}: may not {', '.join(missing)}: {without}")
            else:
                self.add(Status.OK, check, f"{where}: {ok}")

    # --- Temporal ----------------------------------------------------------------------
    async def temporal(self) -> None:
        s = self.settings
        where = f"{s.temporal_address} (namespace {s.temporal_namespace!r})"
        try:
            client = await asyncio.wait_for(connect(s), self.timeout_s)
        except TimeoutError:
            self.add(
                Status.FAIL,
                "temporal",
                f"cannot reach Temporal at {where} within {self.timeout_s:g} s: check "
                "RAYSIZE_TEMPORAL_ADDRESS and that the server is up",
            )
            return
        except SetupError as exc:
            self.add(Status.FAIL, "temporal", str(exc))
            return
        self.add(Status.OK, "temporal", f"{where} answers")
        try:
            await asyncio.wait_for(ensure_search_attributes(client, register=False), self.timeout_s)
        except TimeoutError:
            self.add(
                Status.FAIL,
                "search attributes",
                f"Temporal at {where} did not list them within {self.timeout_s:g} s",
            )
        except SearchAttributesUnknown as exc:
            self.add(Status.WARN, "search attributes", str(exc))
        except SetupError as exc:
            self.add(Status.FAIL, "search attributes", str(exc))
        else:
            self.add(Status.OK, "search attributes", "all of raysize's are registered")

    # --- Ray -------------------------------------------------------------------------
    def ray(self) -> RaySettings | None:
        try:
            ray = ray_settings(self.settings)
        except SetupError as exc:
            self.add(Status.FAIL, "ray client", str(exc))
            return None
        ray.timeout_s = self.timeout_s
        where = f"every cluster's GCS at {ray.gcs_override}" if ray.gcs_override else "each GCS"
        token = "a token" if ray.token else "no token"
        self.add(Status.OK, "ray client", f"{where}: {token}, TLS {'on' if ray.tls else 'off'}")
        return ray

    async def list_clusters(self, kube: Kube, namespaces: list[str]) -> None:
        for ns in namespaces or [""]:
            try:
                items = await self.blocking(
                    functools.partial(kube.list_rayclusters, ns),
                    f"the Kubernetes API at {kube.host}",
                )
            except KubeError as exc:
                where = ns or "every namespace"
                self.listing.append(
                    Check(Status.FAIL, "clusters", f"listing RayClusters in {where}: {exc}")
                )
                continue
            self.managed += [rc for rc in items if is_managed(rc)]

    async def clusters(self, kube: Kube, namespaces: list[str], ray: RaySettings) -> None:
        self.checks += self.listing
        if not self.managed and not self.listing:
            self.add(
                Status.WARN,
                "clusters",
                f"no RayCluster in {_where(namespaces)} has ray.io/ippr or "
                "raysize.io/enabled=true: raysize manages none yet",
            )
            return
        # each cluster's own Ray token, found as the worker finds it (activities/ray_tokens.py)
        tokens = RayTokens(kube.read_secret, ray.token)
        results = await asyncio.gather(*(self.cluster(rc, ray, tokens) for rc in self.managed))
        for checks in results:
            self.checks += checks

    async def cluster(self, rc: Obj, ray: RaySettings, tokens: RayTokens) -> list[Check]:
        meta = rc.get("metadata") or {}
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        ref = f"{ns}/{name}"
        address = ray.dial_address(ns, name, gcs_address(rc))
        return [await self.gcs(ref, rc, address, ray, tokens), resize_policy_check(ref, rc)]

    async def gcs(
        self, ref: str, rc: Obj, address: str, ray: RaySettings, tokens: RayTokens | None = None
    ) -> Check:
        """The GCS at `address` answers (the read every observe makes) with the token the
        worker would send: the cluster's own (`tokens`), else the worker's."""
        source = source_for(rc, ray.token_for)

        def read() -> tuple[int, str]:
            if tokens is not None:
                token = tokens.token(source)
            else:  # no Secret reads: the worker's own token, where it would send it
                token = ray.token if source is not None and source.fallback else None
            where = source.describe() if source is not None and tokens is not None else ""
            with RayGcsClient(
                address, token, ray.tls, timeout=self.timeout_s, token_from=where
            ) as gcs:
                # the read every observe makes (Ray 2.60's autoscaler state), then the
                # version the head recorded
                alive = len(gcs.cluster_state().alive_nodes)
                try:
                    return alive, gcs.ray_version()
                except RayError:  # answered, but no version: spec.rayVersion then
                    return alive, ""

        try:
            alive, version = await self.blocking(read, f"Ray GCS {address}")
        except (RayError, KubeError) as exc:
            return Check(Status.FAIL, f"cluster {ref}", f"GCS {address}: {exc}")
        detail = f"GCS {address} answers, {alive} Raylet{'s' if alive != 1 else ''} alive"
        shown = version
        if not version:
            version = str((rc.get("spec") or {}).get("rayVersion") or "")
            shown = f"{version} (spec.rayVersion; the GCS did not say)"
        if not version:
            return Check(
                Status.WARN,
                f"cluster {ref}",
                f"{detail}; Ray version unknown (the GCS did not say, and no "
                f"spec.rayVersion): raysize needs Ray {MIN_RAY[0]}.{MIN_RAY[1]} or newer",
            )
        parsed = _version(version)
        if parsed is not None and parsed < MIN_RAY:
            return Check(
                Status.FAIL,
                f"cluster {ref}",
                f"{detail}, but Ray {shown} is older than {MIN_RAY[0]}.{MIN_RAY[1]}, which "
                "raysize needs: upgrade the cluster's Ray",
            )
        return Check(Status.OK, f"cluster {ref}", f"{detail}, Ray {shown}")


def _groups(rc: Obj) -> Iterable[tuple[str, Any]]:
    spec = rc.get("spec") or {}
    if isinstance(spec.get("headGroupSpec"), dict):
        yield HEAD_GROUP, spec["headGroupSpec"]
    for g in spec.get("workerGroupSpecs") or []:
        if isinstance(g, dict):
            yield str(g.get("groupName", "?")), g


def _resized_groups(rc: Obj) -> set[str] | None:
    """The groups the cluster's ray.io/ippr annotation lets raysize resize in place (None:
    the annotation does not parse, so every group is looked at)."""
    raw = ((rc.get("metadata") or {}).get("annotations") or {}).get(IPPR_ANNOTATION)
    if raw is None:
        return set()
    try:
        groups = json.loads(raw)["groups"]
    except (ValueError, TypeError, KeyError):
        return None
    return set(groups) if isinstance(groups, dict) else None


def resize_policy_check(ref: str, rc: Obj) -> Check:
    """warn when the Ray container of a group raysize resizes in place restarts on a cpu or
    memory resize (its resizePolicy says RestartContainer). A resource left out resizes in
    place (NotRequired is Kubernetes' default)."""
    resized = _resized_groups(rc)
    restarts: list[str] = []
    for group, spec in _groups(rc):
        container = template_container(spec)
        if container is None or (resized is not None and group not in resized):
            continue
        for policy in container.get("resizePolicy") or []:
            if not isinstance(policy, dict) or policy.get("resourceName") not in ("cpu", "memory"):
                continue
            if policy.get("restartPolicy", NOT_REQUIRED) != NOT_REQUIRED:
                restarts.append(
                    f"group {group} container {container.get('name', '?')} "
                    f"{policy['resourceName']} ({policy.get('restartPolicy')})"
                )
    if restarts:
        return Check(
            Status.WARN,
            f"resize policy {ref}",
            f"a resize would restart the Ray container: {'; '.join(restarts)}: set its "
            f"resizePolicy restartPolicy to {NOT_REQUIRED}",
        )
    if resized == set():
        return Check(Status.OK, f"resize policy {ref}", "no group is resized in place")
    shown = ", ".join(sorted(resized)) if resized else "every group"
    return Check(Status.OK, f"resize policy {ref}", f"cpu and memory resize in place ({shown})")


def doctor(settings: Settings, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Check]:
    return asyncio.run(Doctor(settings, timeout_s).run())


def register(app: typer.Typer) -> None:
    @app.command("doctor", rich_help_panel=OPS_PANEL)
    def doctor_cmd(
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
        timeout: Annotated[
            float,
            typer.Option(min=0.1, help="Seconds each check may take before it counts as failed."),
        ] = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Check what the worker needs, as it would see it (the same RAYSIZE_* settings):
        the Kubernetes API (1.33+, pods/resize served), KubeRay's RayCluster CRD, the
        worker's RBAC in each watched namespace (SelfSubjectAccessReview), Temporal (reachable,
        namespace, search attributes), and for each RayCluster raysize manages its GCS
        (reachable, Ray version) and its containers' resizePolicy. One line per check:
        ok, warn or FAIL; exit 1 when any check FAILs. Writes nothing."""
        checks = doctor(_settings(), timeout)
        failed = any(c.status is Status.FAIL for c in checks)
        if as_json:
            doc = {"ok": not failed, "checks": [c.to_json() for c in checks]}
            typer.echo(json.dumps(doc, indent=2))
        else:
            for c in checks:
                typer.echo(c.line())
        if failed:
            raise typer.Exit(code=1)
