"""The Kubernetes calls raysize makes: `Kube`, on the synchronous `kubernetes` client,
raising the typed errors of `activities.k8s_errors`. Every write is an absolute target, so
a retried call is harmless. The objects it reads are translated in
`activities/k8s_objects.py`; `activities/k8s_activities.py` exposes it to Temporal.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client import rest
from kubernetes.client.exceptions import ApiException
from urllib3.util.retry import Retry

from raysize.activities.k8s_errors import (
    Conflict,
    Forbidden,
    Invalid,
    KubeError,
    NotFound,
    PodGone,
    Superseded,
    Throttled,
    Unavailable,
    error_kind,
    from_api_exception,
)
from raysize.activities.k8s_objects import (
    GROUP_LABEL,
    LAUNCH_SIZES_CONFIGMAP,
    RAY_API,
    RAY_GROUP,
    RAY_PLURAL,
    KubeCluster,
    Obj,
    check_same_pod,
    compact_pod,
    gcs_address,
    is_same_pod,
    launch_size_entries,
    pod_view,
    progress_of,
    ray_autoscaler_running,
    ray_container_resources,
    resize_patch,
    running_size,
)
from raysize.activities.kube_limits import DEFAULT_BURST, DEFAULT_QPS, KubeLimits
from raysize.activities.pod_watch import (
    CLUSTER_LABEL,
    LIST_PAGE,
    PodWatch,
    pods_mark,
    raycluster_mark,
)
from raysize.workflows.contracts import (
    ProgressState,
    ResizeProgress,
)
from raysize.workflows.ippr_status import IPPR_STATUS_ANNOTATION, IpprStatus
from raysize.workflows.model import PodView
from raysize.workflows.raycluster_spec import GroupSpecs, read_group_specs
from raysize.workflows.resources import size_text

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
# objects' metadata only, as the server's meta.k8s.io/v1 PartialObjectMetadataList
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
DEFAULT_TIMEOUT_S = 10.0
log = logging.getLogger("raysize.activities")
# `Kube.scale` reads the pods it names one by one up to this many, checking the pod
# watch's cache with them; more, and it lists the cluster's pods
SCALE_GETS = 50
LAUNCH_SIZES_LABELS = {"app.kubernetes.io/managed-by": "raysize"}
# namespaces where writing the launch-sizes ConfigMap was refused (said once each)
_LAUNCH_SIZES_REFUSED: set[str] = set()
# clusters whose new pods came at their template's size though a size was written (once)
_LAUNCH_SIZE_NOT_IN_FORCE: set[tuple[str, str]] = set()
T = TypeVar("T")


def _items(doc: Obj, namespace: str, cluster: str) -> list[Obj]:
    """The items of a LIST of a cluster's pods; an answer without them is Unavailable."""
    items = doc.get("items")
    if not isinstance(items, list):
        raise Unavailable(f"listing pods of {namespace}/{cluster}: no items in the answer")
    return items


class KubeconfigError(ValueError):
    """No usable Kubernetes configuration: the message names the file and the fix."""


def short_cause(exc: BaseException) -> str:
    """The innermost reason of a connection failure, in a few words (urllib3 nests the
    socket's error three deep: `MaxRetryError(NewConnectionError(ConnectionRefused))`)."""
    seen: set[int] = set()
    inner: BaseException = exc
    while id(inner) not in seen:
        seen.add(id(inner))
        nxt = getattr(inner, "reason", None) or inner.__cause__ or inner.__context__
        if not isinstance(nxt, BaseException):
            break
        inner = nxt
    if isinstance(inner, OSError) and inner.strerror:
        return inner.strerror
    text = str(inner) or type(inner).__name__
    # urllib3's texts end with the socket's own words: "…: [Errno 111] Connection refused"
    if "] " in text and "[Errno" in text:
        text = text.rsplit("] ", 1)[1].rstrip(")'\"")
    return text[:200]


SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


def follow_token_file(cfg: client.Configuration, path: Path) -> None:
    """Send the token the file holds now. The kubelet rewrites a pod's projected token
    before 80 % of its life, and the old one stops working when that life ends; the
    client's in-cluster loader re-reads the file only once a minute, so a token rotated
    less than a minute before its end would be sent after it (401). This re-reads the file
    whenever it changes (a `stat` per request; the kubelet replaces it, so its inode or
    mtime changes)."""
    seen: list[tuple[int, int, int] | None] = [None]

    def refresh(c: client.Configuration) -> None:
        try:
            st = path.stat()
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            if key == seen[0]:
                return
            token = path.read_text().strip()
        except OSError:  # mid-swap, or gone: keep the token we have
            return
        if token:
            c.api_key["BearerToken"] = "bearer " + token  # as the in-cluster loader sets it
            seen[0] = key

    cfg.refresh_api_key_hook = refresh  # type: ignore[assignment]


# connections the pool keeps beside the calls': the watches' (two per namespace watched
# hold one each for minutes), so they never take a call's
WATCH_CONNECTIONS = 8


def fit_pool(cfg: client.Configuration, calls: int) -> bool:
    """Size the client's connection pool for `calls` in flight at once plus the watches
    (`WATCH_CONNECTIONS`); True if it changed (a client made from `cfg` before must be
    made again). Its own size is 5 per CPU (10 on 2 cores): a call beyond the pool opens
    a connection and drops it after, with a urllib3 WARNING each time."""
    want = calls + WATCH_CONNECTIONS if calls > 0 else 0
    if want <= int(cfg.connection_pool_maxsize or 0):
        return False
    cfg.connection_pool_maxsize = want
    return True


def surface_throttling(api: client.ApiClient) -> None:
    """Let a 429 (or 503) with a Retry-After reach raysize. urllib3, under the
    `kubernetes` client, retries such an answer by itself (up to three times, sleeping its
    Retry-After in the calling thread): a throttled call held one of the shared threads
    for up to three Retry-Afters, and nobody saw the throttling. Its other retries
    (connections) stay as they were. Then the limiter holds every call to the server, and
    Temporal retries the activity, for the server's Retry-After (activities/kube_limits.py)."""
    cfg = api.configuration
    retries = cfg.retries
    base = retries if isinstance(retries, Retry) else Retry.DEFAULT
    if isinstance(retries, int) and not isinstance(retries, bool):
        base = Retry.from_int(retries)
    if retries is False or not base.respect_retry_after_header:
        return
    cfg.retries = base.new(respect_retry_after_header=False)
    old, api.rest_client = api.rest_client, rest.RESTClientObject(cfg)
    old.close()


def _as_scale_reads(meta: Obj | None) -> tuple[str, str, bool] | None:
    """What `Kube.scale` reads of a pod's metadata: UID, group, being deleted (None: no
    such pod)."""
    if meta is None:
        return None
    group = str((meta.get("labels") or {}).get(GROUP_LABEL, ""))
    return str(meta.get("uid")), group, bool(meta.get("deletionTimestamp"))


class Kube:
    """The Kubernetes calls raysize makes, with typed errors and a timeout on every call,
    within the server's request budget (`limits`: QPS, burst, and the server's
    Retry-After; activities/kube_limits.py)."""

    # the pod watch whose cache `read_cluster` may read: told of every pod write, so a
    # cached read sees this process's own writes (`PodWatch.wrote`)
    pod_watch: PodWatch | None = None

    def __init__(
        self,
        api: client.ApiClient,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        limits: KubeLimits | None = None,
    ) -> None:
        surface_throttling(api)
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.timeout_s = timeout_s
        self.limits = limits or KubeLimits(self.host)
        # (namespace, cluster, group) → (the size its new pods should start at, the UIDs of
        # the group's pods when it was written): the first pod created after is looked at
        # once (`_launched_as_asked`)
        self._launch_asked: dict[tuple[str, str, str], tuple[tuple[int, int], frozenset[str]]] = {}

    @classmethod
    def from_kubeconfig(
        cls,
        path: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
        connections: int = 0,
    ) -> Kube:
        """`connections`: calls to have in flight at once (the worker's threads for this
        server): the client's connection pool holds as many, beside the watches' (0: the
        client's own size)."""
        cfg = client.Configuration()
        in_cluster = False
        if path is None:
            try:
                config.load_incluster_config(client_configuration=cfg)
                in_cluster = True
            except config.ConfigException:
                pass
        if in_cluster:
            follow_token_file(cfg, SERVICE_ACCOUNT_TOKEN)
        else:
            try:
                config.load_kube_config(config_file=path, client_configuration=cfg)
            except Exception as exc:  # the client's errors range from ConfigException to TypeError
                where = path or os.environ.get("KUBECONFIG") or "~/.kube/config"
                reason = (str(exc).splitlines()[0] if str(exc) else type(exc).__name__).rstrip(".")
                if not isinstance(exc, (config.ConfigException, OSError)):
                    reason = f"not a kubeconfig ({type(exc).__name__}: {reason})"
                raise KubeconfigError(
                    f"cannot load the kubeconfig {where}: {reason}. Point RAYSIZE_KUBECONFIG (or "
                    "KUBECONFIG) at a valid kubeconfig file; in a pod, raysize uses its "
                    "ServiceAccount instead"
                ) from None
        # sized before the client is made from it: the client's connection pool is made once
        fit_pool(cfg, connections)
        return cls._with_limits(client.ApiClient(cfg), timeout_s, qps, burst)

    @classmethod
    def _with_limits(cls, api: client.ApiClient, timeout_s: float, qps: float, burst: int) -> Kube:
        host = str(getattr(api.configuration, "host", "") or "?")
        return cls(api, timeout_s, KubeLimits(host, qps, burst))

    def _call(self, kind: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        self.limits.acquire()  # blocks this thread (never the event loop: calls run in threads)
        try:
            result = fn(*args, _request_timeout=self.timeout_s, **kwargs)
        except ApiException as exc:
            err = from_api_exception(exc, kind=kind, server=self.host)
            self._failed(err)
            raise err from exc
        except KubeError:
            raise
        except Exception as exc:  # timeouts, refused connections, TLS: all "unknown"
            err = Unavailable(f"cannot reach the Kubernetes API at {self.host}: {short_cause(exc)}")
            self._failed(err)
            raise err from exc
        self.limits.answered()
        return result

    def _failed(self, err: KubeError) -> None:
        """Count the error by kind; a 429 holds every call to this server for its
        Retry-After, another answer may end a throttling episode."""
        if isinstance(err, Throttled):
            self.limits.throttled(err.retry_after)
            return
        self.limits.count_error(error_kind(err))
        if err.status:  # the server answered
            self.limits.answered()

    def call(self, kind: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Any call of the `kubernetes` client beyond the methods here (`raysize doctor`'s
        checks), with the same timeout and typed errors."""
        return self._call(kind, fn, *args, **kwargs)

    @property
    def host(self) -> str:
        return str(getattr(self.api.configuration, "host", "") or "?")

    def _raw(self, kind: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
        response = self._call(kind, fn, *args, _preload_content=False, **kwargs)
        try:
            doc: Obj = json.loads(response.data)
        finally:
            # back to the pool: without this every call opens a new connection (and, on a
            # real cluster, a new TLS handshake)
            response.release_conn()
        return doc

    # --- reads ----------------------------------------------------------------------
    def get_pod(self, namespace: str, pod: str) -> Obj:
        return self._raw("Pod", self.core.read_namespaced_pod, pod, namespace)

    def read_secret(self, namespace: str, name: str) -> Obj:
        """A Secret by name (`get` only: a Ray cluster's token, `activities/ray_tokens.py`)."""
        return self._raw("Secret", self.core.read_namespaced_secret, name, namespace)

    def list_rayclusters(self, namespace: str) -> list[Obj]:
        """Every RayCluster in a namespace ("" for all namespaces)."""
        if namespace:
            doc = self._call(
                "RayCluster",
                self.custom.list_namespaced_custom_object,
                "ray.io",
                "v1",
                namespace,
                "rayclusters",
            )
        else:
            doc = self._call(
                "RayCluster", self.custom.list_cluster_custom_object, "ray.io", "v1", "rayclusters"
            )
        items = doc.get("items") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise Unavailable(f"listing RayClusters in {namespace or 'all namespaces'}: no items")
        return items

    def get_raycluster(self, namespace: str, name: str) -> Obj:
        return self._raw(
            "RayCluster",
            self.custom.get_namespaced_custom_object,
            RAY_GROUP,
            RAY_API,
            namespace,
            RAY_PLURAL,
            name,
        )

    def list_cluster_pods(self, namespace: str, cluster: str) -> tuple[list[Obj], str]:
        """The cluster's pods as records of what `read_cluster` reads (`compact_pod`, as
        the pod watch keeps them), and their `pods_mark`. A fresh LIST, in pages of
        `LIST_PAGE`, each page's records made before the next is parsed: parsed whole,
        5,000 KubeRay pods left the worker about 160 MB bigger for good."""
        records: list[Obj] = []
        token = ""
        while True:
            doc = self._raw(
                "Pod",
                self.core.list_namespaced_pod,
                namespace,
                label_selector=f"ray.io/cluster={cluster}",
                limit=LIST_PAGE,
                _continue=token or None,
            )
            records += [compact_pod(item) for item in _items(doc, namespace, cluster)]
            token = str((doc.get("metadata") or {}).get("continue") or "")
            del doc
            if not token:
                break
        # the mark of the pods (equality only), not the list's resourceVersion: opaque, it
        # cannot say whether a pod the watch reports is newer than this list
        return records, pods_mark(r["metadata"] for r in records)

    def list_cluster_pod_metadata(self, namespace: str, cluster: str) -> tuple[list[Obj], str]:
        """The metadata of the cluster's pods (a fresh LIST, as `list_cluster_pods`), and
        their `pods_mark`: what names, UIDs, groups and deletions are read from. Asked as a
        PartialObjectMetadataList, as client-go's metadata informers ask, so neither the
        server nor this worker handles specs and statuses: at 5,000 KubeRay pods the whole
        PodList is about 200 MB of JSON. A server that cannot answer so sends the PodList,
        read the same way."""
        doc = self._raw(
            "Pod",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=f"ray.io/cluster={cluster}",
            _headers={"Accept": f"{METADATA_LIST}, application/json"},
        )
        metas = [item.get("metadata") or {} for item in _items(doc, namespace, cluster)]
        return metas, pods_mark(metas)

    def write_launch_sizes(
        self, namespace: str, cluster: str, groups: dict[str, tuple[Obj, tuple[int, int] | None]]
    ) -> None:
        """Set (or clear) the size the new pods of each group start at, in the namespace's
        `raysize-launch-sizes` ConfigMap, which the `raysize-launch-size` admission policy
        applies as KubeRay creates them. A write nothing would change is not made. Not
        allowed (RBAC, deploy/): said once per namespace, and pods start at their
        template's size, grown once they run, as before."""
        entries: dict[str, str | None] = {}
        for group, (template, size) in groups.items():
            if size is not None and not any(size):
                size = None
            entries.update(launch_size_entries(cluster, group, template, size))
        for attempt in range(3):
            try:
                self._write_launch_sizes(namespace, entries)
            except Conflict:
                if attempt == 2:
                    raise
                continue  # another worker wrote it meanwhile: read it again
            except Forbidden as exc:
                if namespace not in _LAUNCH_SIZES_REFUSED:
                    _LAUNCH_SIZES_REFUSED.add(namespace)
                    log.warning(
                        "%s/%s: new pods start at their template's size and grow once they "
                        "run: raysize may not write ConfigMap %s/%s (%s). To launch pods at "
                        "the size their work needs, grant it (deploy/ does) and install the "
                        "raysize-launch-size admission policy; or set "
                        "RAYSIZE_LAUNCH_AT_SIZE=false",
                        namespace,
                        cluster,
                        namespace,
                        LAUNCH_SIZES_CONFIGMAP,
                        exc,
                    )
                return
            break
        _LAUNCH_SIZES_REFUSED.discard(namespace)
        log.info(
            "%s/%s: new pods of %s start at %s",
            namespace,
            cluster,
            ", ".join(sorted(groups)),
            ", ".join(
                f"{g}: {'its template' if s is None or not any(s) else size_text(*s)}"
                for g, (_, s) in sorted(groups.items())
            ),
        )

    def _launched_as_asked(
        self, namespace: str, cluster: str, views: tuple[PodView, ...], groups: GroupSpecs
    ) -> None:
        """The first pod of a group made after raysize wrote the size its new pods start at:
        at its template's size instead (never resized), the launch-size admission policy is
        not in force there; said once per cluster, with what to do."""
        for (ns, name, group), (size, before) in list(self._launch_asked.items()):
            if (ns, name) != (namespace, cluster):
                continue
            spec = groups.groups.get(group)
            new = [v for v in views if v.group == group and v.uid and v.uid not in before]
            if spec is None or not new:
                continue
            del self._launch_asked[(ns, name, group)]
            template = (spec.resources.cpu, spec.resources.memory)
            at = [v for v in new if not v.resized and (v.total.cpu, v.total.memory) == template]
            if not at or (ns, name) in _LAUNCH_SIZE_NOT_IN_FORCE:
                continue
            _LAUNCH_SIZE_NOT_IN_FORCE.add((ns, name))
            log.warning(
                "%s/%s: new pod %s of group %s started at its template's %s, not the %s "
                "raysize launched it at: the raysize-launch-size admission policy is not in "
                "force (install deploy/components/launch-size; Kubernetes 1.36+; Helm "
                "launchAtSize.enabled=true), so pods start small and grow once they run, "
                "where their node has room; or set RAYSIZE_LAUNCH_AT_SIZE=false",
                namespace,
                cluster,
                at[0].name,
                group,
                size_text(*template),
                size_text(*size),
            )

    def _write_launch_sizes(self, namespace: str, entries: dict[str, str | None]) -> None:
        """One read and one write of the ConfigMap (created if missing); `Conflict` when
        another writer moved it in between."""
        try:
            cm = self._raw(
                "ConfigMap",
                self.core.read_namespaced_config_map,
                LAUNCH_SIZES_CONFIGMAP,
                namespace,
            )
        except NotFound:
            cm = None
        data = (cm or {}).get("data") or {}
        change = {k: v for k, v in entries.items() if data.get(k) != v}
        if not change:
            return
        if cm is None:
            if not any(v is not None for v in change.values()):
                return
            body = {
                "metadata": {"name": LAUNCH_SIZES_CONFIGMAP, "labels": LAUNCH_SIZES_LABELS},
                "data": {k: v for k, v in change.items() if v is not None},
            }
            self._call("ConfigMap", self.core.create_namespaced_config_map, namespace, body)
        else:
            # guarded by the version read: another worker's write in between is retried
            patch = {
                "metadata": {"resourceVersion": cm["metadata"]["resourceVersion"]},
                "data": change,
            }
            self._call(
                "ConfigMap",
                self.core.patch_namespaced_config_map,
                LAUNCH_SIZES_CONFIGMAP,
                namespace,
                patch,
            )

    def scale_pods(self, namespace: str, cluster: str, named: set[str]) -> list[Obj]:
        """The metadata of the cluster's pods that `scale` decides on: from the pod watch's
        cache, checked by a fresh read of each pod `named` (those the write would name
        or keeps named); a LIST (`list_cluster_pod_metadata`) when the cache cannot answer
        (`PodWatch.cluster_pods`: not synced, or this worker's own write not back yet), when
        more than `SCALE_GETS` pods are named, or when a fresh read disagrees with the
        cache on what the write reads of a pod (whether it exists, its UID, its group,
        whether it is being deleted): then the watch lags, and nothing is decided on its
        view. (Not the resourceVersion: a pod KubeRay or the kubelet is changing moves on
        by the milliseconds the watch takes, and every scale-in would list.)

        The LIST cost 2.2–3.0 s at 5,000 pods (19 MB of metadata to parse, every scale-in);
        the GETs a few milliseconds each. What the write needs fresh is fresh: whether each
        pod it names exists, with which UID, and not being deleted. The count of pods not
        named (the floor of `replicas`) comes from the watch, as client-go's controllers
        count from their informers; a pod KubeRay creates in the milliseconds before the
        write is missed by a LIST made before it as well."""
        watch = self.pod_watch
        if watch is None or len(named) > SCALE_GETS:
            return self.list_cluster_pod_metadata(namespace, cluster)[0]
        found = watch.cluster_pods(namespace, cluster)
        if found is None:
            return self.list_cluster_pod_metadata(namespace, cluster)[0]
        cached = {p["metadata"]["name"]: p["metadata"] for p in found[0]}
        for name in sorted(named):
            try:
                fresh: Obj | None = self.get_pod(namespace, name)["metadata"]
            except PodGone:
                fresh = None
            seen = cached.get(name)
            if fresh is not None and (fresh.get("labels") or {}).get(CLUSTER_LABEL) != cluster:
                fresh = None  # a pod of that name, but of another cluster: not ours to name
            if _as_scale_reads(fresh) != _as_scale_reads(seen):
                log.info(
                    "%s/%s: the pod watch is behind on pod %s; listing the pods to scale",
                    namespace,
                    cluster,
                    name,
                )
                return self.list_cluster_pod_metadata(namespace, cluster)[0]
        return list(cached.values())

    def cluster_pods(
        self, namespace: str, cluster: str, cached: bool = False
    ) -> tuple[list[Obj], str]:
        """The cluster's pods and their `pods_mark`: with `cached`, from the pod watch's
        cache once it is synced (`PodWatch.cluster_pods`: records of what `read_cluster`
        reads), else (and until then) a LIST."""
        pods, mark, _ = self._cluster_pods(namespace, cluster, cached)
        return pods, mark

    def _cluster_pods(
        self, namespace: str, cluster: str, cached: bool
    ) -> tuple[list[Obj], str, bool]:
        """`cluster_pods`, and whether they came from the cache."""
        watch = self.pod_watch if cached else None
        if watch is None:
            return *self.list_cluster_pods(namespace, cluster), False
        found = watch.cluster_pods(namespace, cluster)
        if found is not None:
            return found[0], found[1], True
        since = watch.list_mark(namespace)
        pods, mark = self.list_cluster_pods(namespace, cluster)
        # the cache takes what this LIST found newer than it has (a watch that lags, or
        # went silent, must not serve the next read from before this one)
        watch.listed(namespace, cluster, pods, since)
        return pods, mark, False

    def read_cluster(self, namespace: str, name: str, cached: bool = False) -> KubeCluster:
        """The RayCluster (a GET) and its pods: a LIST, or with `cached` the pod watch's
        cache when it can answer (`cluster_pods`; see `activities/pod_watch.py` for which
        decisions that is safe for)."""
        rc = self.get_raycluster(namespace, name)
        pods, pods_version, from_cache = self._cluster_pods(namespace, name, cached)
        spec = rc.get("spec") or {}
        views = tuple(pod_view(p) for p in pods if not p["metadata"].get("deletionTimestamp"))
        replicas, to_delete = {}, []
        for g in spec.get("workerGroupSpecs") or []:
            replicas[g.get("groupName", "")] = int(g.get("replicas") or 0)
            to_delete += list((g.get("scaleStrategy") or {}).get("workersToDelete") or [])
        resizing = tuple(
            v.name
            for v, p in zip(views, pods, strict=False)
            if v.resize is not None and v.resize.state.in_flight
        )
        groups = read_group_specs(rc)
        if self._launch_asked:
            self._launched_as_asked(namespace, name, views, groups)
        return KubeCluster(
            namespace=namespace,
            name=name,
            raycluster=rc,
            groups=groups,
            pods=views,
            replicas=replicas,
            workers_to_delete=tuple(to_delete),
            resource_version=str(rc["metadata"].get("resourceVersion", "")),
            generation=int(rc["metadata"].get("generation") or 0),
            stale_to_delete=tuple(sorted(set(to_delete) - {p["metadata"]["name"] for p in pods})),
            pods_version=pods_version,
            pods_cached=from_cache,
            resizing=resizing,
            gcs_address=gcs_address(rc),
            mark=raycluster_mark(rc),
            ray_autoscaler_pod=ray_autoscaler_running(pods),
        )

    def find_pod(self, namespace: str, pod: str, uid: str = "") -> Obj | None:
        """The pod, or None when it is gone (or, given its `uid`, replaced by another pod
        of the same name)."""
        try:
            found = self.get_pod(namespace, pod)
        except PodGone:
            return None
        return found if is_same_pod(found, uid) else None

    def resize_progress(
        self, namespace: str, pod: str, cpu: int, memory: int, generation: int, uid: str = ""
    ) -> ResizeProgress:
        found = self.find_pod(namespace, pod, uid)
        if found is None:
            return ResizeProgress(state=ProgressState.POD_GONE)
        return progress_of(found, cpu, memory, generation)

    # --- writes ---------------------------------------------------------------------
    # A pod write given the pod's `uid` (the one the decision was made on) changes only
    # that pod: another pod created under its name raises PodGone, as a deleted one does.
    # The server checks it (docs/design/kubernetes-resize.md §1 *UID preconditions*): a JSON patch
    # starts with a `test` of /metadata/uid, a merge patch carries metadata.uid (a change
    # of an immutable field for any other pod). Both are refused with a 422 that does not
    # say which pod is there, so a refusal is read back: the pod gone or replaced is PodGone.
    def patch_resize(
        self,
        namespace: str,
        pod: str,
        cpu: int,
        memory: int,
        uid: str = "",
        expect: tuple[tuple[int, int], ...] | None = None,
    ) -> int:
        """Resize the Ray container to absolute (cpu, memory); returns the pod's generation
        (`resize_pod` returns the pod as written)."""
        doc = self.resize_pod(namespace, pod, cpu, memory, uid, expect)
        return int(doc["metadata"].get("generation", 0))

    def resize_pod(
        self,
        namespace: str,
        pod: str,
        cpu: int,
        memory: int,
        uid: str = "",
        expect: tuple[tuple[int, int], ...] | None = None,
    ) -> Obj:
        """Resize the Ray container to absolute (cpu, memory); returns the pod as written.

        With `expect`, a compare-and-set: the patch is sent only while the pod runs at one
        of those sizes or at the target already (`running_size`; a retry of a patch that
        landed goes on). Elsewhere it raises `Superseded` and sends nothing: the resize
        was decided on a pod that is not there any more (a stale cache), and patching
        would set the live pod to a size nobody chose for it, a busy grown pod shrunk
        under its work.

        The pod compared is the pod watch's record when its cache is current and the
        record passes (`PodWatch.cached_pod`): the patch then `test`s the record's
        resourceVersion, so the server applies it only to that very pod, and a record that
        lagged is refused (422) and costs nothing but the refusal. Otherwise, or after a
        refusal, the pod is read (a GET) and compared, and the patch `test`s the
        container's resources as read: a resize by anyone between the read and the write
        fails the patch, and raises Conflict (retried: the retry reads and compares
        again). In a 1,000-cluster burst one worker's requests are paced by its QPS, and
        the GET was one request in five of a resize's."""
        cached = None if self.pod_watch is None else self.pod_watch.cached_pod(namespace, pod)
        if (
            cached is not None
            and cached.get("spec")  # a Ray pod's record (of others, only name and version)
            and is_same_pod(cached, uid)
            and (expect is None or running_size(cached) in {*expect, (cpu, memory)})
            and (version := cached["metadata"].get("resourceVersion"))
        ):
            with contextlib.suppress(Invalid):  # moved on since the record: read it
                ops = resize_patch(cached, cpu, memory)
                test = {"op": "test", "path": "/metadata/resourceVersion", "value": version}
                ops.insert(0, test)
                return self._write_pod(
                    namespace, pod, uid, self.core.patch_namespaced_pod_resize, ops, JSON_PATCH
                )
        current = self.get_pod(namespace, pod)
        check_same_pod(current, namespace, pod, uid)
        resources = ray_container_resources(current)
        if expect is not None:
            at = running_size(current)
            if at not in {*expect, (cpu, memory)}:
                sizes = " or ".join(size_text(c, m) for c, m in dict.fromkeys(expect))
                raise Superseded(
                    f"pod {namespace}/{pod} runs at {size_text(*at)}, not at {sizes or '?'} "
                    f"where the resize to {size_text(cpu, memory)} was decided from: not "
                    "patched",
                    current,
                )
        ops = resize_patch(current, cpu, memory)
        if expect is not None and resources:
            # the pod as compared: a resize by anyone since this read fails the whole patch
            path = "/spec/containers/0/resources"
            ops.insert(0, {"op": "test", "path": path, "value": resources})
        if uid:
            # the patch is built from a read: the pod may be replaced before it lands
            ops.insert(0, {"op": "test", "path": "/metadata/uid", "value": uid})
        try:
            doc = self._write_pod(
                namespace, pod, uid, self.core.patch_namespaced_pod_resize, ops, JSON_PATCH
            )
        except Invalid:
            if expect is not None:
                now = self.find_pod(namespace, pod, uid)
                if now is not None and ray_container_resources(now) != resources:
                    raise Conflict(
                        f"pod {namespace}/{pod} was resized by someone else while raysize "
                        "patched it"
                    ) from None
            raise
        return doc

    def set_ippr_status(self, namespace: str, pod: str, status: IpprStatus, uid: str = "") -> Obj:
        """Write ray.io/ippr-status; returns the pod as it is now."""
        meta: Obj = {"annotations": {IPPR_STATUS_ANNOTATION: status.to_annotation()}}
        if uid:
            meta["uid"] = uid
        return self._write_pod(
            namespace, pod, uid, self.core.patch_namespaced_pod, {"metadata": meta}, MERGE_PATCH
        )

    def _write_pod(
        self, namespace: str, pod: str, uid: str, fn: Callable[..., Any], body: Any, kind: str
    ) -> Obj:
        try:
            written = self._raw("Pod", fn, pod, namespace, body, _content_type=kind)
        except Invalid:
            if uid:
                check_same_pod(self.find_pod(namespace, pod), namespace, pod, uid)
            raise
        if self.pod_watch is not None:
            self.pod_watch.wrote(namespace, written)
        return written

    def scale(
        self,
        namespace: str,
        cluster: str,
        replicas: dict[str, int],
        workers_to_delete: dict[str, tuple[str, ...]],
        generation: int = 0,
        pod_uids: dict[str, str] | None = None,
        launch_sizes: dict[str, tuple[int, int]] | None = None,
    ) -> bool:
        """Set groups' replicas and name pods in workersToDelete, in one write; False if
        the RayCluster already says so. Before a group's replicas go up, the size its new
        pods start at (`launch_sizes`, millicores and bytes; a group not named starts at
        its template's) goes into the namespace's launch-sizes ConfigMap
        (`write_launch_sizes`); `launch_sizes` None: the ConfigMap is left alone.

        Exact, so KubeRay never picks a pod of its own (it deletes any pods it likes when
        there are more than `replicas` and too few are named):
        - a pod is named only if it still exists with the UID decided on (`pod_uids`);
        - `replicas` goes down by exactly the pods named: one decided on but gone or
          replaced keeps its replica, and no group is set below its live pods not named;
        - names of pods that no longer exist leave workersToDelete (KubeRay would delete
          a later pod of the same name at birth).
        The write is guarded by the spec's `generation` (what was decided from; KubeRay's
        status writes leave it), unless the cluster already says what was asked: a retry
        after a write that succeeded is then a no-op, not a conflict.
        """
        rc = self.get_raycluster(namespace, cluster)
        groups = (rc.get("spec") or {}).get("workerGroupSpecs") or []
        index = {g.get("groupName"): i for i, g in enumerate(groups)}
        unknown = sorted((set(replicas) | set(workers_to_delete)) - set(index))
        if unknown:
            raise Invalid(f"RayCluster {namespace}/{cluster} has no worker group {unknown[0]!r}")
        named = {n for names in workers_to_delete.values() for n in names}
        for group in groups:
            named.update((group.get("scaleStrategy") or {}).get("workersToDelete") or [])
        metas = self.scale_pods(namespace, cluster, named)
        existing = {m["name"] for m in metas}
        alive = {m["name"]: m for m in metas if not m.get("deletionTimestamp")}
        uids = pod_uids or {}
        current = int(rc["metadata"].get("generation") or 0)
        if generation and generation != current:
            # our own write may have landed already (a retried activity): then it is done
            if _says(groups, index, replicas, workers_to_delete, existing):
                return False
            raise Conflict(
                f"RayCluster {namespace}/{cluster}'s spec changed since it was read "
                f"(generation {generation} → {current})"
            )
        ops: list[Obj] = []
        grown: list[str] = []  # the groups whose replicas go up: their new pods' size first
        for name, i in index.items():
            group = groups[i]
            listed = list((group.get("scaleStrategy") or {}).get("workersToDelete") or [])
            kept = [n for n in listed if n in existing]
            wanted = [
                n
                for n in workers_to_delete.get(name, ())
                if n in alive and uids.get(n, "") in ("", alive[n].get("uid"))
            ]
            merged = kept + [n for n in wanted if n not in kept]
            if name in replicas:
                gone = len(workers_to_delete.get(name, ())) - len(wanted)
                unnamed = sum(
                    1
                    for n, m in alive.items()
                    if (m.get("labels") or {}).get(GROUP_LABEL) == name and n not in merged
                )
                target = max(replicas[name] + gone, unnamed)
                if target > int(group.get("replicas") or 0):
                    grown.append(name)
                if int(group.get("replicas") or 0) != target:
                    ops.append(
                        {
                            "op": "add",
                            "path": f"/spec/workerGroupSpecs/{i}/replicas",
                            "value": target,
                        }
                    )
            if merged != listed:
                if "scaleStrategy" not in group:
                    ops.append(
                        {
                            "op": "add",
                            "path": f"/spec/workerGroupSpecs/{i}/scaleStrategy",
                            "value": {},
                        }
                    )
                ops.append(
                    {
                        "op": "add",
                        "path": f"/spec/workerGroupSpecs/{i}/scaleStrategy/workersToDelete",
                        "value": merged,
                    }
                )
        if not ops:
            return False
        if grown and launch_sizes is not None:
            self.write_launch_sizes(
                namespace,
                cluster,
                {g: (groups[index[g]].get("template") or {}, launch_sizes.get(g)) for g in grown},
            )
            for g in grown:
                size = launch_sizes.get(g)
                key = (namespace, cluster, g)
                if size and any(size) and namespace not in _LAUNCH_SIZES_REFUSED:
                    there = frozenset(
                        str(m.get("uid") or "")
                        for m in metas
                        if (m.get("labels") or {}).get(GROUP_LABEL) == g
                    )
                    self._launch_asked[key] = (size, there)
                else:
                    self._launch_asked.pop(key, None)
        # the spec as decided from: a change by anyone in between fails the whole write
        ops.insert(0, {"op": "test", "path": "/metadata/generation", "value": current})
        try:
            self._call(
                "RayCluster",
                self.custom.patch_namespaced_custom_object,
                RAY_GROUP,
                RAY_API,
                namespace,
                RAY_PLURAL,
                cluster,
                ops,
                _content_type=JSON_PATCH,
            )
        except Invalid as exc:
            if "test failed" in exc.message or "rejected our request" in exc.message:
                raise Conflict(f"RayCluster {namespace}/{cluster} changed while scaling") from exc
            raise
        return True

    def record_event(
        self, namespace: str, kind: str, name: str, reason: str, message: str, warning: bool = False
    ) -> Obj:
        if kind == "Pod":
            obj, api_version = self.get_pod(namespace, name), "v1"
        elif kind == "RayCluster":
            obj, api_version = self.get_raycluster(namespace, name), f"{RAY_GROUP}/{RAY_API}"
        else:
            raise Invalid(f"events are recorded on Pods and RayClusters, not {kind}")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": {
                "kind": kind,
                "namespace": namespace,
                "name": name,
                "apiVersion": api_version,
                "uid": obj["metadata"]["uid"],
                "resourceVersion": obj["metadata"].get("resourceVersion", ""),
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "raysize"},
            "reportingComponent": "raysize",
            "reportingInstance": "raysize",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        return self._raw(kind, self.core.create_namespaced_event, namespace, body)


def _says(
    groups: list[Obj],
    index: dict[Any, int],
    replicas: dict[str, int],
    workers_to_delete: dict[str, tuple[str, ...]],
    existing: set[str],
) -> bool:
    """The RayCluster already says what was asked: each group at its replicas, and each
    pod named either listed or gone."""
    for name, i in index.items():
        group = groups[i]
        if name in replicas and int(group.get("replicas") or 0) != replicas[name]:
            return False
        listed = set((group.get("scaleStrategy") or {}).get("workersToDelete") or [])
        if any(n in existing and n not in listed for n in workers_to_delete.get(name, ())):
            return False
    return True
