"""One Kubernetes watch per namespace, shared by every activity that waits on a pod.

A resize saga waits for the kubelet to act on its pod. Polling each pod (GET every
0.2 s) costs a thousand concurrent resizes 5,000 requests a second — more than a real API
server lets one client make, and most of the worker's CPU. Instead the worker keeps one
watch on the pods of each namespace it waits in and hands each change of a pod to the
activities waiting on it. An activity reads the pod itself only when it starts, after
the watch reconnects, and when nothing was heard for its poll interval (a silent or
dropped watch must never leave a resize waiting forever).

Each watch is an informer's: LIST, then WATCH from the list's resourceVersion, resuming
from the last one seen (an event's or a bookmark's) when a connection ends. When the
server has let that version go (410 Gone: its watch window moved on, or etcd compacted
it), it lists again and delivers what changed meanwhile, deletions too. resourceVersions
are opaque: they are kept, sent back and compared for equality, never ordered.

With a `custom` API client it also watches the namespace's RayClusters, so a reconcile
waiting on its cluster wakes when the RayCluster's spec or annotations change (an edited
`ray.io/ippr`, a new maximum, a deletion) and not only when a pod does: an idle cluster
then needs no periodic re-read to notice anything.

**The pod cache: which reads are cached, and why that is safe.** The watch keeps each
Ray pod (label `ray.io/cluster`) of its namespace as a record of only what `KubeCluster`
reads (`k8s_objects.compact_pod`: a few hundred bytes instead of the pod's kilobytes), by
cluster. The observe (`Kube.read_cluster(..., cached=True)`) reads a cluster's pods from
it once the namespace is *synced* — listed, and the watch connected and caught up: from
a list just made, or resumed within `resume_fresh_s` of a watch the server ended (with
a bookmark of how far it got), or resumed after longer and heard from (a 410 would come
first), and heard from within `stale_after_s` since (an event, a bookmark or a new
connection: the server ends each watch after `timeout_s`, with a bookmark, so a live
stream is never silent for long; a stream an idle NAT dropped without closing it says
nothing at all) — and LISTs while it is not: at the start, while a dropped watch
reconnects, after a 410 until the new list is in, and while the watch is silent (its
read times out at the same bound, and it reconnects). Such a LIST refreshes the cache
(`listed`), so a read after it is never older than it. So a LIST happens to start,
after a 410 and while a watch is silent; the RayCluster itself is still a GET per
observe. A cached view lags the server by the watch's delay (milliseconds), which is
safe for what is decided from it:

- *raysize's own writes are seen.* Every pod write of this process (`Kube._write_pod`:
  the resize patch, `ray.io/ippr-status`) is told to the watch (`wrote`), and a cached
  read of that cluster waits (at most `WRITE_WAIT_S`) until the watch has delivered that
  version of the pod, or the pod's deletion or replacement, or a list made after the
  write; else it LISTs. So a tick is never planned on a pod from before a resize or
  status this worker wrote. Another worker's writes are seen as soon as this watch
  delivers them; a decision made in that moment is caught by the checks below.
- *a resize acts on the pod as it is.* The saga patches only the pod as it is now
  (`Kube.resize_pod` builds the patch from this cache's record and the server refuses it
  unless the pod's resourceVersion is still the record's; else from a GET), and only
  while it runs at the size the resize was decided from (a compare-and-set: elsewhere
  it is `Superseded`, not patched), every pod write carries the UID it was decided on
  (a replaced pod is `PodGone`), targets are absolute (a repeated resize is a no-op),
  and a running saga keeps its pod (one workflow id per pod: a second decision is a
  retarget signal).
- *scale-in names only pods that exist.* `Kube.scale` reads each pod it names (or keeps
  named) fresh, with a GET, and names a pod only while it exists with the UID decided
  on, under the RayCluster's generation; the count of the pods it does not name comes
  from this cache. A GET that disagrees with the cache (a pod the cache lacks or still
  has, another UID or group, a deletion not seen yet) means this watch lags: the scale
  then LISTs the pods' metadata and decides on that (`Kube.scale_pods`).
- *the wait's mark matches.* The observe's `pods_version` is the `pods_mark` of the
  records it read, the same that `cluster_pods_mark` computes on the cache, so the wait
  compares like with like (`ClusterActivities._pods_changed_since_observe`).

The saga's progress (`progress_of`) never reads the cache: it reads the pod, or the
whole object of the watch's event.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from raysize.activities.k8s_objects import compact_pod, forget_pod
from raysize.activities.kube_limits import KubeLimits, retry_after_of

log = logging.getLogger("raysize.activities")

GONE_STATUS = 410  # the watch's resourceVersion is too old: list again
THROTTLED_STATUS = 429  # the server's APF turned the list or watch away: its Retry-After holds

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, pod), or (namespace, CLUSTER + cluster) for a cluster
CLUSTER = "cluster:"  # pod names never contain ':'
CLUSTER_LABEL = "ray.io/cluster"
GONE = "gone"  # the mark of a RayCluster that was deleted
# how long a cached read waits for the watch to deliver a pod write of this process
# before it lists instead (the watch is normally milliseconds behind)
WRITE_WAIT_S = 2.0
# pod versions delivered last, to tell a write the watch delivered before its writer said
# so (`PodWatch.wrote`); thousands of events in the moment between a write's answer and
# that call never happen
RECENT_VERSIONS = 1024
# deletions the watch delivered last, to tell a read's LIST made before one of them
GONE_KEPT = 16384
# ... and for at most this long: a read's LIST that began before a deletion ends long
# before (its request times out), so a deleted cluster's pods leave no mark behind
GONE_KEPT_S = 300.0
# RayClusters deleted whose GONE mark is kept for a wait that begins after the deletion
# (the worker that ran the cluster's loop drops it at once: `forget_cluster`)
GONE_CLUSTERS_KEPT = 1024
LIST_PAGE = 500  # objects per page of a list (client-go's pager reads 500 a page too)
RESUME_FRESH_S = 1.0
# the server ends each watch after this long (`timeoutSeconds`), with a bookmark of how far
# it got just before (the real server's watch cache sends one 2 s before the end), and the
# watch resumes: a healthy stream is never silent for much longer than this
WATCH_TIMEOUT_S = 30
# a watch that delivered nothing (no event, no bookmark, no new connection) for longer
# than this is taken as broken: a connection an idle load balancer or NAT dropped without
# closing it stays "open" and silent. The pod cache is then not synced (reads list) and
# the stream's read times out, so the watch reconnects
STALE_SLACK_S = 15.0
CONNECT_TIMEOUT_S = 10.0


def _kept_meta(obj: Obj) -> Obj:
    """What the watch keeps of an object it needs no more of: its name and version (for
    a list's comparison)."""
    meta = obj.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("name", "resourceVersion") if k in meta}}


def _kept_pod(obj: Obj) -> Obj:
    """A Ray pod as `KubeCluster` reads it (`compact_pod`); of any other pod, its name and
    version only."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return compact_pod(obj) if CLUSTER_LABEL in labels else _kept_meta(obj)


def _cluster_of(record: Obj | None) -> str:
    return str(((record or {}).get("metadata") or {}).get("labels", {}).get(CLUSTER_LABEL) or "")


def raycluster_mark(obj: Obj) -> str:
    """What of a RayCluster a decision depends on: its spec (`metadata.generation` moves
    with every spec change; status writes leave it) and its annotations. A status update
    by KubeRay leaves the mark as it was, so it wakes nobody."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    digest = hashlib.blake2b(
        json.dumps(annotations, sort_keys=True).encode(), digest_size=6
    ).hexdigest()
    return f"{meta.get('generation', 0)}/{digest}"


def pods_mark(metas: Iterable[Obj]) -> str:
    """What tells one state of a set of pods from another: each pod's name and
    resourceVersion (from its metadata), hashed. Two marks are equal or not; nothing else
    about them means anything, as resourceVersions are opaque."""
    pairs = sorted((str(m.get("name", "")), str(m.get("resourceVersion", ""))) for m in metas)
    return hashlib.blake2b(json.dumps(pairs).encode(), digest_size=8).hexdigest()


def list_pages(
    list_fn: Callable[..., Any],
    *args: Any,
    take: Callable[[], None],
    timeout_s: float,
    **kwargs: Any,
) -> Iterator[Obj]:
    """LIST in pages of `LIST_PAGE`, as client-go's pager reads: each page's parsed
    document, one at a time (`take`: a token of the server's budget before every page but
    the first, which the caller took)."""
    token = ""
    while True:
        if token:
            take()  # every page is a request to the server
        resp = list_fn(
            *args,
            **kwargs,
            limit=LIST_PAGE,
            _continue=token or None,
            _preload_content=False,
            _request_timeout=timeout_s + 30,
        )
        try:
            doc = json.loads(resp.data)
        finally:
            resp.release_conn()
        token = str((doc.get("metadata") or {}).get("continue") or "")
        yield doc
        if not token:
            return


class _RawWatch(watch.Watch):
    """Events as the server sent them (`object` a dict; the client's model classes would
    cost more CPU than the rest of the watch), while an ERROR event still raises
    `ApiException` with its code, as the client documents (with `deserialize=False` it
    raised KeyError('raw_object') instead, and the 410 branch never ran)."""

    def __init__(self) -> None:
        watch.Watch.__init__(self)

    def get_return_type(self, func: Any) -> None:
        return None  # no model class: each event's object stays the server's JSON

    def stream(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[Obj]:
        events: Iterator[Obj] = watch.Watch.stream(self, func, *args, **kwargs)
        return events

    def stop(self) -> None:
        watch.Watch.stop(self)


@dataclass(eq=False)
class Subscription:
    """Hears of every change of one pod after `subscribe`."""

    key: Key
    loop: asyncio.AbstractEventLoop
    event: asyncio.Event = field(default_factory=asyncio.Event)
    latest: Obj | None = None  # the newest version delivered; None: read the pod yourself
    deleted: bool = False

    def _wake(self, obj: Obj | None, deleted: bool) -> None:
        self.latest, self.deleted = obj, deleted
        self.loop.call_soon_threadsafe(self.event.set)

    async def wait(self, timeout: float) -> bool:
        """True when the pod changed (see `latest`), False after `timeout` s of silence."""
        try:
            await asyncio.wait_for(self.event.wait(), timeout)
        except TimeoutError:
            return False
        self.event.clear()
        return True


@dataclass(frozen=True)
class _Written:
    """A pod this process wrote, until the watch delivers that version of it (or the pod
    is gone or replaced, or a list made after the write is in)."""

    version: str
    uid: str
    cluster: str
    seq: int  # the write's place among this process's writes


class PodWatch:
    """Namespaces are watched from the first wait on one of their pods (or the first
    cached read, `cluster_pods`) until `close`."""

    def __init__(
        self,
        core: Any,
        custom: Any = None,
        *,
        timeout_s: int = WATCH_TIMEOUT_S,
        stale_after_s: float | None = None,
        limits: KubeLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`limits`: the API server's request budget (activities/kube_limits.py): each
        list and each (re)connect takes a token, the events none. `timeout_s`: the
        server-side timeout of each watch; `stale_after_s` (default `timeout_s` +
        `STALE_SLACK_S`): how long a watch may deliver nothing before it is taken as
        broken. `clock`: the monotonic clock that silence is measured on."""
        self.core = core
        self.custom = custom
        self.timeout_s = timeout_s
        self.stale_after_s = timeout_s + STALE_SLACK_S if stale_after_s is None else stale_after_s
        self.clock = clock
        # how long a cached read waits for the watch to deliver this process's own write
        self.write_wait_s = WRITE_WAIT_S
        # a watch resumed within this long after the server ended the last one is caught up
        # at once (else after the first thing the server sends on it)
        self.resume_fresh_s = RESUME_FRESH_S
        self.limits = limits
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a sync or a write delivered
        self._subs: dict[Key, list[Subscription]] = {}
        # each namespace's pods as the watch has them (name → `_kept_pod`), once listed
        self._pods: dict[str, dict[str, Obj]] = {}
        # the same records by Ray cluster: (namespace, cluster) → name → record
        self._by_cluster: dict[tuple[str, str], dict[str, Obj]] = {}
        # namespaces whose pod cache is current: listed, and the watch connected since
        self._synced: set[str] = set()
        # pods this process wrote that the watch has not delivered yet
        self._written: dict[Key, _Written] = {}
        self._writes = 0
        self._recent: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self.cached_reads = 0  # `cluster_pods` answered from the cache
        self.uncached_reads = 0  # `cluster_pods` answered None: the caller lists
        self.refreshed = 0  # pod records a read's LIST brought into the cache (`listed`)
        # when each namespace's pod watch last heard from the server (`clock`): a new
        # connection, an event, a bookmark
        self._heard: dict[str, float] = {}
        self._stale_said: set[str] = set()  # namespaces whose silence was logged
        # a count of the pod watch's deliveries (and lists), and the count at each pod's
        # last: a read's LIST leaves a pod the watch delivered meanwhile as the watch has it
        self._seq = 0
        self._touched: dict[Key, int] = {}
        # the same, of deletions, with when they were delivered (`clock`)
        self._gone_at: OrderedDict[Key, tuple[int, float]] = OrderedDict()
        self._relisted: dict[str, int] = {}  # `_seq` at each namespace's last watch list
        # pods whose record came from a read's LIST ahead of the watch: (uid, version, or
        # GONE); the watch's older versions of them are not taken until it gets there
        self._ahead: dict[Key, tuple[str, str]] = {}
        # the number of the last change of each cluster's pods the watch delivered after
        # its first list (from `_changes`, this process's count of all such changes, so
        # never the same for two changes); kept only while a wait listens to the cluster
        # (it reads its start under its subscription), so a deleted cluster leaves none
        self._cluster_changes: dict[tuple[str, str], int] = {}
        self._changes = 0
        # the newest mark of each RayCluster (see `raycluster_mark`), from the watch; a
        # deleted one's GONE for a while (`_gone_clusters`, at most GONE_CLUSTERS_KEPT)
        self._cluster_marks: dict[tuple[str, str], str] = {}
        self._gone_clusters: OrderedDict[tuple[str, str], None] = OrderedDict()
        # told of each RayCluster the watch sees deleted (namespace, name), on its thread:
        # the worker frees what it keeps for it (`ClusterActivities.forget_cluster`)
        self.on_cluster_deleted: list[Callable[[str, str], None]] = []
        self._threads: dict[str, threading.Thread] = {}
        self._watches: dict[str, watch.Watch] = {}
        self._stop = threading.Event()

    def subscribe(
        self, namespace: str, pod: str
    ) -> contextlib.AbstractContextManager[Subscription]:
        """Hear of every change of one pod."""
        return self._subscribe((namespace, pod))

    def subscribe_cluster(
        self, namespace: str, cluster: str
    ) -> contextlib.AbstractContextManager[Subscription]:
        """Hear of every change of any pod of a Ray cluster (label ray.io/cluster)."""
        return self._subscribe((namespace, CLUSTER + cluster))

    def cluster_changes(self, namespace: str, cluster: str) -> int:
        """Where the changes of the cluster's pods this watch delivered stand: a wait
        counts from here (`cluster_changed_since`). Read under a `subscribe_cluster` of
        the cluster: the count is kept only while one listens."""
        with self._lock:
            return self._cluster_changes.get((namespace, cluster), 0)

    def cluster_pods_mark(self, namespace: str, cluster: str) -> str | None:
        """`pods_mark` of the cluster's pods as the watch has them; None until its first
        list (then the watch cannot tell)."""
        with self._lock:
            if namespace not in self._pods:
                return None
            pods = self._by_cluster.get((namespace, cluster)) or {}
            return pods_mark(p["metadata"] for p in pods.values())

    def cached_pod(self, namespace: str, pod: str) -> Obj | None:
        """The pod's record (`compact_pod`) while the namespace's cache is current
        (`synced`), else None. It may still lag the server: a write built from it guards
        itself with the record's resourceVersion (`Kube.resize_pod`)."""
        with self._lock:
            if not self._live(namespace):
                return None
            return (self._pods.get(namespace) or {}).get(pod)

    def synced(self, namespace: str) -> bool:
        """Is the namespace's pod cache current: listed, and its watch connected since
        (and not dropped or answered 410 after), and heard from within `stale_after_s`
        (silence is not news: a stream dropped on the way without being closed says
        nothing at all)?"""
        with self._lock:
            return self._live(namespace)

    def _live(self, namespace: str) -> bool:
        """`synced`, under the lock."""
        if namespace not in self._synced:
            return False
        silent = self.clock() - self._heard.get(namespace, float("-inf"))
        if silent <= self.stale_after_s:
            return True
        if namespace not in self._stale_said:
            self._stale_said.add(namespace)
            log.warning(
                "pod-watch-%s: nothing heard for %.0f s (no event, no bookmark): not synced; "
                "reads list the pods until the watch is heard from again",
                namespace,
                silent,
            )
        return False

    def _hear(self, namespace: str) -> None:
        """The namespace's pod watch heard from the server (under the lock)."""
        self._heard[namespace] = self.clock()
        self._stale_said.discard(namespace)

    def _writes_pending(self, namespace: str, cluster: str) -> bool:
        """A write of this process to a pod of the cluster the watch has not delivered
        (under the lock)."""
        return any(k[0] == namespace and w.cluster == cluster for k, w in self._written.items())

    async def delivered(self, namespace: str, cluster: str, wait_s: float) -> bool:
        """Wait on the event loop, holding no thread, until the watch has delivered this
        process's writes to the cluster's pods: True then (or at once when there are
        none), False after `wait_s`, or at once when the namespace's watch is not synced
        (the caller's read lists then). An observe waits here before its read
        (`cluster_pods` waits only `write_wait_s` more, on a thread of the API server's):
        in a 1,000-cluster burst the watch ran seconds behind this worker's resize
        writes, and each observe that listed instead held one of the server's threads
        for up to 10 s, added to the load that kept the watch behind, and, the threads
        all taken, left other calls to fail unsent."""
        self._ensure(namespace)
        with self._lock:  # the usual case, on every observe: nothing to wait for
            if not self._live(namespace) or not self._writes_pending(namespace, cluster):
                return self._live(namespace)
        deadline = time.monotonic() + wait_s
        with self.subscribe_cluster(namespace, cluster) as changes:
            while True:
                with self._lock:
                    if not self._live(namespace):
                        return False
                    if not self._writes_pending(namespace, cluster):
                        return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                # a delivery of one of its pods wakes this; a sync lost, the timeout, too
                await changes.wait(min(left, 1.0))

    def cluster_pods(
        self, namespace: str, cluster: str, wait_s: float | None = None
    ) -> tuple[list[Obj], str] | None:
        """The cluster's pods from the cache (`compact_pod` records: what `KubeCluster`
        reads) and their `pods_mark`; None when the cache cannot answer and the caller
        must list: the namespace's watch is not synced (starting, dropped, or listing
        again after a 410), or a pod of the cluster this process wrote has not come back
        through the watch within `wait_s` (default `write_wait_s`). Starts the
        namespace's watch. Blocking (it may wait for the watch): call it from a thread."""
        self._ensure(namespace)
        key = (namespace, cluster)

        def ready() -> bool:
            return self._live(namespace) and not self._writes_pending(namespace, cluster)

        with self._changed:
            synced = self._live(namespace)
            wait = self.write_wait_s if wait_s is None else wait_s
            if synced and self._changed.wait_for(ready, wait):
                pods = list((self._by_cluster.get(key) or {}).values())
                self.cached_reads += 1
            else:
                self.uncached_reads += 1
                if synced and self._live(namespace):
                    # the caller lists, and that list holds every write made up to here:
                    # writes a connected watch has not delivered in `wait_s` are not waited
                    # for again (a watch that is away keeps them: it resumes before them)
                    mine = [k for k, w in self._written.items() if k[0] == namespace]
                    for k in mine:
                        if self._written[k].cluster == cluster:
                            del self._written[k]
                return None
        return pods, pods_mark(p["metadata"] for p in pods)

    def wrote(self, namespace: str, pod: Obj) -> None:
        """This process wrote `pod` (the server's answer): a cached read of its cluster
        waits until the watch has delivered that version (read-your-writes)."""
        meta = pod.get("metadata") or {}
        name, version = meta.get("name"), meta.get("resourceVersion")
        if not name or not version:
            return
        with self._changed:
            self._writes += 1
            if (
                f"pod-watch-{namespace}" not in self._threads
                or (namespace, name, str(version)) in self._recent
            ):
                return  # no cache of it, or the watch was first
            self._written[(namespace, name)] = _Written(
                version=str(version),
                uid=str(meta.get("uid") or ""),
                cluster=str((meta.get("labels") or {}).get(CLUSTER_LABEL) or ""),
                seq=self._writes,
            )

    def cluster_changed_since(
        self, namespace: str, cluster: str, changes: int | None, mark: str = ""
    ) -> bool:
        """Has a pod of the cluster changed since the watch had delivered `changes`
        (`cluster_changes`; None: not asked), or the RayCluster since it had `mark`
        (`raycluster_mark`; empty: not asked)?"""
        key = (namespace, cluster)
        with self._lock:
            seen = self._cluster_marks.get(key)
            if mark and seen is not None and seen != mark:
                return True
            return changes is not None and self._cluster_changes.get(key, 0) != changes

    @contextlib.contextmanager
    def _subscribe(self, key: Key) -> Iterator[Subscription]:
        self._ensure(key[0])
        sub = Subscription(key, asyncio.get_running_loop())
        with self._lock:
            self._subs.setdefault(sub.key, []).append(sub)
        try:
            yield sub
        finally:
            with self._lock:
                subs = self._subs.get(sub.key, [])
                with contextlib.suppress(ValueError):
                    subs.remove(sub)
                if not subs:
                    self._subs.pop(sub.key, None)
                    if sub.key[1].startswith(CLUSTER):  # nobody counts its changes now
                        self._cluster_changes.pop((sub.key[0], sub.key[1][len(CLUSTER) :]), None)

    def forget_cluster(self, namespace: str, cluster: str) -> None:
        """The cluster is gone (its loop's observe found no RayCluster): drop its GONE
        mark now rather than keep it for a wait that will not come."""
        key = (namespace, cluster)
        with self._lock:
            if self._cluster_marks.get(key) == GONE:
                del self._cluster_marks[key]
            self._gone_clusters.pop(key, None)

    def cluster_state(self) -> dict[str, int]:
        """How many entries the per-cluster maps hold (`bench.tenant_churn_bench`, the
        tests): each is freed when its cluster is gone."""
        with self._lock:
            return {
                "pod_watch.cluster_marks": len(self._cluster_marks),
                "pod_watch.cluster_changes": len(self._cluster_changes),
                "pod_watch.by_cluster": len(self._by_cluster),
                "pod_watch.subscriptions": len(self._subs),
            }

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            watches = list(self._watches.values())
        for w in watches:
            w.stop()

    # --- the watch thread -----------------------------------------------------------------
    def _ensure(self, namespace: str) -> None:
        Deliver = Callable[[str, str, Obj, Obj, bool], None]
        # (thread name, list function and its arguments, deliver, whether it lists pods)
        watches: list[tuple[str, Callable[..., Any], tuple[Any, ...], Deliver, bool]] = [
            (
                f"pod-watch-{namespace}",
                self.core.list_namespaced_pod,
                (namespace,),
                self._deliver,
                True,
            )
        ]
        if self.custom is not None:
            watches.append(
                (
                    f"raycluster-watch-{namespace}",
                    self.custom.list_namespaced_custom_object,
                    ("ray.io", "v1", namespace, "rayclusters"),
                    self._deliver_cluster,
                    False,
                )
            )
        for name, list_fn, args, deliver, pods in watches:
            with self._lock:
                if name in self._threads or self._stop.is_set():
                    continue
                thread = threading.Thread(
                    target=self._run,
                    args=(namespace, name, list_fn, args, deliver, pods),
                    name=name,
                    daemon=True,
                )
                self._threads[name] = thread
            thread.start()

    def _run(
        self,
        namespace: str,
        name: str,
        list_fn: Callable[..., Any],
        args: tuple[Any, ...],
        deliver: Callable[[str, str, Obj, Obj, bool], None],
        pods: bool,
    ) -> None:
        known: dict[str, Obj] = {}  # each object as kept (`_kept_pod`), as last delivered
        version = ""  # "": list first; else where the next watch resumes (never ordered)
        backoff = 0.5
        # The cache is current (synced) while the watch is connected and caught up: at once
        # when it connects from a list just made, or resumes within `resume_fresh_s` of
        # a connection that ended as the server meant it to (it ends with a bookmark of
        # how far it got); a watch resumed after longer (a drop, a slow reconnect) only
        # once the server has sent something on it, as a 410 would come first.
        listed, ended_at = [False], [0.0]

        def connect(*a: Any, **kw: Any) -> Any:
            """The watch request: its answer's headers mean the watch is connected."""
            resp = list_fn(*a, **kw)
            if pods:
                with self._lock:
                    self._hear(namespace)
            if pods and (listed[0] or 0 < ended_at[0] >= time.monotonic() - self.resume_fresh_s):
                self._set_synced(namespace, True)
            listed[0], ended_at[0] = False, 0.0
            return resp

        while not self._stop.is_set():
            w = _RawWatch()
            with self._lock:
                self._watches[name] = w
            try:
                if not version:
                    self._take()
                    version = self._list(namespace, list_fn, args, deliver, known, pods)
                    listed[0] = True
                self._take()
                for ev in w.stream(
                    connect,
                    *args,
                    resource_version=version,
                    allow_watch_bookmarks=True,  # the server says how far it got: fewer 410s
                    timeout_seconds=self.timeout_s,
                    # a read that waits longer than the staleness bound for a byte: the
                    # stream is dead (dropped on the way, never closed): reconnect
                    _request_timeout=(CONNECT_TIMEOUT_S, self.stale_after_s),
                ):
                    kind, obj = ev.get("type"), ev.get("object") or {}
                    meta = obj.get("metadata") or {}
                    version = meta.get("resourceVersion") or version
                    if pods:
                        with self._lock:
                            self._hear(namespace)
                    if pods and kind != "ERROR" and namespace not in self._synced:
                        # the server took the version: caught up from here
                        self._set_synced(namespace, True)
                    if not meta.get("name") or kind == "BOOKMARK":
                        continue
                    kept = (
                        _kept_meta(obj)
                        if kind == "DELETED"
                        else (_kept_pod(obj) if pods else _kept_meta(obj))
                    )
                    with self._lock:
                        before = self._apply_event(namespace, kind, meta, kept, known, pods)
                    # a deletion is told with the labels the pod had (which cluster it was of)
                    told = (before or kept)["metadata"] if kind == "DELETED" else kept["metadata"]
                    deliver(namespace, meta["name"], obj, told, kind == "DELETED")
                    backoff = 0.5
                # the server ended the watch (its timeout): caught up to here, reconnecting
                if pods:
                    self._set_synced(namespace, False)
                ended_at[0] = time.monotonic()
            except ApiException as exc:
                if pods:
                    self._set_synced(namespace, False)
                if exc.status == THROTTLED_STATUS and self.limits is not None:
                    # every call to this server waits out its Retry-After, this one too
                    self.limits.throttled(retry_after_of(exc.headers))
                if exc.status != GONE_STATUS:
                    self._dropped(namespace, name, exc, backoff)
                    backoff = min(backoff * 2, 10.0)
                    continue
                # our version is too old for the server (410 Gone: its watch window moved
                # on, or etcd compacted it): list again, and deliver what changed meanwhile
                log.info(
                    "%s: resourceVersion %s is gone (410 %s); listing again",
                    name,
                    version,
                    exc.reason,
                )
                version = ""
            except Exception as exc:  # the connection dropped: resume from `version`
                if pods:
                    self._set_synced(namespace, False)
                if self._stop.is_set():
                    return
                self._dropped(namespace, name, exc, backoff)
                backoff = min(backoff * 2, 10.0)
            finally:
                w.stop()
        if pods:
            self._set_synced(namespace, False)

    def _apply_event(
        self, namespace: str, kind: Any, meta: Obj, kept: Obj, known: dict[str, Obj], pods: bool
    ) -> Obj | None:
        """An event into the cache (`known`: the watch's records; `kept`: this event's),
        under the lock; the record it had before."""
        name = str(meta["name"])
        if pods and self._behind_a_read(namespace, kind, meta):
            before = known.get(name)  # the read's LIST put a newer one there
        else:
            before = known.pop(name, None)
            if kind != "DELETED":
                known[name] = kept
        if pods:
            self._index(namespace, name, before, known.get(name))
        return before

    def _behind_a_read(self, namespace: str, kind: Any, meta: Obj) -> bool:
        """Is this event of a pod older than the record a read's LIST put in the cache
        (`listed`)? The watch delivers every version in order, so until it delivers the
        listed one (or the pod's deletion, or another pod of its name) what it delivers is
        from before it. Counts the delivery (under the lock)."""
        key = (namespace, str(meta.get("name")))
        self._seq += 1
        if kind == "DELETED":
            self._touched.pop(key, None)
            now = self.clock()
            self._gone_at[key] = (self._seq, now)
            self._gone_at.move_to_end(key)
            while self._gone_at and (
                len(self._gone_at) > GONE_KEPT
                or next(iter(self._gone_at.values()))[1] < now - GONE_KEPT_S
            ):
                self._gone_at.popitem(last=False)
        else:
            self._touched[key] = self._seq
        ahead = self._ahead.get(key)
        if ahead is None:
            return False
        uid, version = ahead
        if kind == "DELETED" or str(meta.get("uid") or "") != uid:
            del self._ahead[key]
            return False
        if version != GONE and str(meta.get("resourceVersion") or "") == version:
            del self._ahead[key]  # caught up with the read: the same record from here
            return False
        return True

    def list_mark(self, namespace: str) -> int:
        """Where the pod watch's deliveries stand: give it to `listed` with a read's LIST
        made after this call."""
        with self._lock:
            return self._seq

    def listed(self, namespace: str, cluster: str, records: list[Obj], since: int) -> None:
        """A read's LIST of the cluster's pods (`compact_pod` records), begun after `since`
        (`list_mark`): the cache takes it rather than throw it away, so a watch that lags
        (or went silent) serves no read older than the LIST that exposed it. A pod the
        watch delivered meanwhile is left as the watch has it, and everything is left when
        the watch listed meanwhile (its own list is as new); the watch's older versions of
        a pod taken here are not taken after it (`_behind_a_read`)."""
        with self._changed:
            known = self._pods.get(namespace)
            if known is None or self._relisted.get(namespace, 0) > since:
                return  # not listed yet (its own list comes), or listed since
            fresh = {str(r["metadata"]["name"]): r for r in records}
            cached = self._by_cluster.get((namespace, cluster)) or {}
            taken = 0
            for name in sorted(set(fresh) | set(cached)):
                key = (namespace, name)
                if max(self._touched.get(key, 0), self._gone_at.get(key, (0, 0.0))[0]) > since:
                    continue  # the watch delivered it during the LIST: as new as the LIST
                new, old = fresh.get(name), known.get(name)
                if new is None:
                    if old is None or _cluster_of(old) != cluster:
                        continue
                    del known[name]  # gone, as the LIST says: the watch has not said so yet
                    self._ahead[key] = (str(old["metadata"].get("uid") or ""), GONE)
                else:
                    version = str(new["metadata"].get("resourceVersion") or "")
                    if old is not None and old["metadata"].get("resourceVersion") == version:
                        continue
                    known[name] = new
                    self._ahead[key] = (str(new["metadata"].get("uid") or ""), version)
                self._index(namespace, name, old, known.get(name))
                taken += 1
            if taken:
                self.refreshed += taken
                log.info(
                    "pod-watch-%s: a read's list of %s had %d pod(s) newer than the watch's "
                    "cache; the cache takes them",
                    namespace,
                    cluster,
                    taken,
                )

    def _set_synced(self, namespace: str, synced: bool) -> None:
        with self._changed:
            if synced and not self._stop.is_set():
                self._synced.add(namespace)
                self._changed.notify_all()
            else:
                self._synced.discard(namespace)

    def _index(self, namespace: str, name: str, before: Obj | None, after: Obj | None) -> None:
        """Keep `_by_cluster` in step with a pod's record (under the lock)."""
        old, new = _cluster_of(before), _cluster_of(after)
        if old and old != new:
            group = self._by_cluster.get((namespace, old))
            if group is not None:
                group.pop(name, None)
                if not group:
                    del self._by_cluster[(namespace, old)]
        if new and after is not None:
            self._by_cluster.setdefault((namespace, new), {})[name] = after

    def _take(self) -> None:
        """A token of the server's budget, before a list or a watch's (re)connect."""
        if self.limits is not None:
            self.limits.acquire()

    def _dropped(self, namespace: str, name: str, exc: Exception, backoff: float) -> None:
        """The connection (or the list) failed: everyone looks again, then a pause."""
        log.info("%s dropped (%s); reconnecting", name, exc)
        self._wake_all(namespace)
        self._stop.wait(backoff)

    def _list(
        self,
        namespace: str,
        list_fn: Callable[..., Any],
        args: tuple[Any, ...],
        deliver: Callable[..., None],
        known: dict[str, Obj],
        pods: bool,
    ) -> str:
        """LIST, in pages of `LIST_PAGE` as client-go's reflector reads; deliver every
        object that is new or has another resourceVersion than the one delivered last,
        and the deletion of each one gone; the list's resourceVersion (where the watch
        starts). For pods, the cache is replaced by the list's records.

        Each page's parse is dropped once its records are made: parsed whole, 5,000
        KubeRay pods took about 160 MB more than their records, and the worker's RSS kept
        it (the records sit among the freed objects, so the allocator can give little
        back); by pages, about 17 MB. The whole object is kept only for delivery to the
        subscribers of that pod (a resize being waited for) and for RayClusters."""
        with self._lock:
            writes = self._writes  # every write up to here is in the list (a quorum read)
            before = {n: (r.get("metadata") or {}).get("resourceVersion") for n, r in known.items()}
        keep = _kept_pod if pods else _kept_meta
        seen: set[str] = set()
        kept: dict[str, Obj] = {}
        whole: dict[str, Obj] = {}  # delivered whole: RayClusters, pods subscribed to
        version = ""
        for doc in list_pages(list_fn, *args, take=self._take, timeout_s=self.timeout_s):
            meta = doc.get("metadata") or {}
            version = version or str(meta.get("resourceVersion") or "")
            with self._lock:
                heard = {k[1] for k in self._subs if k[0] == namespace}
            for item in doc.get("items") or []:
                name = (item.get("metadata") or {}).get("name")
                if not name:
                    continue
                seen.add(name)
                if before.get(name) != item["metadata"].get("resourceVersion"):
                    kept[name] = keep(item)
                    if not pods or name in heard:
                        whole[name] = item
            del doc
        if not version:
            raise ValueError(f"a list of {namespace} without a resourceVersion")
        with self._lock:
            gone = {n: known.pop(n) for n in [n for n in known if n not in seen]}
            known.update(kept)
            if pods:
                for n, record in gone.items():
                    self._index(namespace, n, record, None)
                for n, record in kept.items():
                    self._index(namespace, n, None, record)
        for n, record in gone.items():
            deliver(namespace, n, {"metadata": record["metadata"]}, record["metadata"], True)
        for n in sorted(kept):
            if n in whole:
                deliver(namespace, n, whole[n], kept[n]["metadata"], False)
            else:  # its record: a subscriber that came since reads the pod itself
                deliver(namespace, n, kept[n], kept[n]["metadata"], False, whole=False)
        if pods:
            with self._changed:
                self._pods[namespace] = known  # from now on a change of a pod counts
                self._hear(namespace)
                self._seq += 1
                self._relisted[namespace] = self._seq
                for key in [k for k in self._ahead if k[0] == namespace]:
                    del self._ahead[key]  # the watch's own list is as new as any read's
                for key in [k for k in self._touched if k[0] == namespace and k[1] not in known]:
                    del self._touched[key]
                for key in [
                    k for k, w in self._written.items() if k[0] == namespace and w.seq <= writes
                ]:
                    del self._written[key]
                self._changed.notify_all()
        return version

    def _deliver_cluster(
        self, namespace: str, name: str, obj: Obj, meta: Obj, deleted: bool
    ) -> None:
        mark = GONE if deleted else raycluster_mark(obj)
        key = (namespace, name)
        with self._lock:
            before = self._cluster_marks.get(key)
            if not deleted:
                self._cluster_marks[key] = mark
                self._gone_clusters.pop(key, None)
            elif before is not None and before != GONE:
                # kept a while: a wait that starts after this, on an observe from before,
                # still sees the cluster changed
                self._cluster_marks[key] = GONE
                self._gone_clusters[key] = None
                while len(self._gone_clusters) > GONE_CLUSTERS_KEPT:
                    old, _ = self._gone_clusters.popitem(last=False)
                    if self._cluster_marks.get(old) == GONE:
                        del self._cluster_marks[old]
            subs = list(self._subs.get((namespace, CLUSTER + name), ()))
            told = list(self.on_cluster_deleted) if deleted else []
        if before is not None and before != mark:
            for sub in subs:
                sub._wake(None, deleted)
        for tell in told:
            tell(namespace, name)

    def _deliver(
        self, namespace: str, name: str, obj: Obj, meta: Obj, deleted: bool, whole: bool = True
    ) -> None:
        """A change of a pod; `obj` is the whole pod, or (not `whole`, from a list) its
        record, which subscribers are not given."""
        cluster = (meta.get("labels") or {}).get(CLUSTER_LABEL)
        with self._changed:
            subs = list(self._subs.get((namespace, name), ()))
            if cluster:
                listening = self._subs.get((namespace, CLUSTER + cluster), ())
                subs += listening
                # the first list is how things are, no change; counted only for a wait
                if namespace in self._pods and listening:
                    self._changes += 1
                    self._cluster_changes[(namespace, cluster)] = self._changes
            self._recent[(namespace, name, str(meta.get("resourceVersion") or ""))] = None
            if len(self._recent) > RECENT_VERSIONS:
                self._recent.popitem(last=False)
            written = self._written.get((namespace, name))
            uid = ((obj.get("metadata") or {}).get("uid")) or ""
            if deleted:
                forget_pod(str(uid))  # its view, kept while it lived (`pod_view`)
            if written is not None and (
                deleted or meta.get("resourceVersion") == written.version or uid != written.uid
            ):
                # the watch has come as far as our write (or past the pod it was of)
                del self._written[(namespace, name)]
                self._changed.notify_all()
        for sub in subs:
            sub._wake(obj if whole else None, deleted)

    def _wake_all(self, namespace: str) -> None:
        with self._lock:
            subs = [s for key, group in self._subs.items() if key[0] == namespace for s in group]
        for sub in subs:
            sub._wake(None, False)
