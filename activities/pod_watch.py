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
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from raysize.activities.kube_limits import KubeLimits, retry_after_of

log = logging.getLogger("raysize.activities")

GONE_STATUS = 410  # the watch's resourceVersion is too old: list again
THROTTLED_STATUS = 429  # the server's APF turned the list or watch away: its Retry-After holds

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, pod), or (namespace, CLUSTER + cluster) for a cluster
CLUSTER = "cluster:"  # pod names never contain ':'
CLUSTER_LABEL = "ray.io/cluster"
GONE = "gone"  # the mark of a RayCluster that was deleted


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


class PodWatch:
    """Namespaces are watched from the first wait on one of their pods until `close`."""

    def __init__(
        self,
        core: Any,
        custom: Any = None,
        *,
        timeout_s: int = 300,
        limits: KubeLimits | None = None,
    ) -> None:
        """`limits`: the API server's request budget (activities/kube_limits.py): each
        list and each (re)connect takes a token, the events none."""
        self.core = core
        self.custom = custom
        self.timeout_s = timeout_s
        self.limits = limits
        self._lock = threading.Lock()
        self._subs: dict[Key, list[Subscription]] = {}
        # each namespace's pods as the watch has them (name → metadata), once listed
        self._pods: dict[str, dict[str, Obj]] = {}
        # how many changes of each cluster's pods the watch delivered after its first list
        # (a count of this process's own, so ordering it is sound)
        self._cluster_changes: dict[tuple[str, str], int] = {}
        # the newest mark of each RayCluster (see `raycluster_mark`), from the watch
        self._cluster_marks: dict[tuple[str, str], str] = {}
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
        """How many changes of the cluster's pods this watch has delivered: a wait counts
        from here (`cluster_changed_since`)."""
        with self._lock:
            return self._cluster_changes.get((namespace, cluster), 0)

    def cluster_pods_mark(self, namespace: str, cluster: str) -> str | None:
        """`pods_mark` of the cluster's pods as the watch has them; None until its first
        list (then the watch cannot tell)."""
        with self._lock:
            pods = self._pods.get(namespace)
            if pods is None:
                return None
            return pods_mark(
                m for m in pods.values() if (m.get("labels") or {}).get(CLUSTER_LABEL) == cluster
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
        known: dict[str, Obj] = {}  # each object's metadata, as last delivered
        version = ""  # "": list first; else where the next watch resumes (never ordered)
        backoff = 0.5
        while not self._stop.is_set():
            w = _RawWatch()
            with self._lock:
                self._watches[name] = w
            try:
                if not version:
                    self._take()
                    version = self._list(namespace, list_fn, args, deliver, known, pods)
                self._take()
                for ev in w.stream(
                    list_fn,
                    *args,
                    resource_version=version,
                    allow_watch_bookmarks=True,  # the server says how far it got: fewer 410s
                    timeout_seconds=self.timeout_s,
                    _request_timeout=self.timeout_s + 30,
                ):
                    kind, obj = ev.get("type"), ev.get("object") or {}
                    meta = obj.get("metadata") or {}
                    version = meta.get("resourceVersion") or version
                    if not meta.get("name") or kind == "BOOKMARK":
                        continue
                    with self._lock:
                        if kind == "DELETED":
                            known.pop(meta["name"], None)
                        else:
                            known[meta["name"]] = meta
                    deliver(namespace, meta["name"], obj, meta, kind == "DELETED")
                    backoff = 0.5
            except ApiException as exc:
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
                if self._stop.is_set():
                    return
                self._dropped(namespace, name, exc, backoff)
                backoff = min(backoff * 2, 10.0)
            finally:
                w.stop()

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
        deliver: Callable[[str, str, Obj, Obj, bool], None],
        known: dict[str, Obj],
        pods: bool,
    ) -> str:
        """LIST; deliver every object that is new or has another resourceVersion than the
        one delivered last, and the deletion of each one gone; the list's resourceVersion
        (where the watch starts)."""
        resp = list_fn(*args, _preload_content=False, _request_timeout=self.timeout_s + 30)
        doc = json.loads(resp.data)
        version = str((doc.get("metadata") or {}).get("resourceVersion") or "")
        if not version:
            raise ValueError(f"a list of {namespace} without a resourceVersion")
        now: dict[str, Obj] = {}
        for item in doc.get("items") or []:
            meta = item.get("metadata") or {}
            if meta.get("name"):
                now[meta["name"]] = item
        with self._lock:
            gone = {n: known.pop(n) for n in [n for n in known if n not in now]}
            changed = [
                (n, item)
                for n, item in sorted(now.items())
                if (known.get(n) or {}).get("resourceVersion")
                != item["metadata"].get("resourceVersion")
            ]
            known.update((n, item["metadata"]) for n, item in changed)
        for n, meta in gone.items():
            deliver(namespace, n, {"metadata": meta}, meta, True)
        for n, item in changed:
            deliver(namespace, n, item, item["metadata"], False)
        if pods:
            with self._lock:
                self._pods[namespace] = known  # from now on a change of a pod counts
        return version

    def _deliver_cluster(
        self, namespace: str, name: str, obj: Obj, meta: Obj, deleted: bool
    ) -> None:
        mark = GONE if deleted else raycluster_mark(obj)
        key = (namespace, name)
        with self._lock:
            before = self._cluster_marks.get(key)
            self._cluster_marks[key] = mark
            subs = list(self._subs.get((namespace, CLUSTER + name), ()))
        if before is not None and before != mark:
            for sub in subs:
                sub._wake(None, deleted)

    def _deliver(self, namespace: str, name: str, obj: Obj, meta: Obj, deleted: bool) -> None:
        cluster = (meta.get("labels") or {}).get(CLUSTER_LABEL)
        with self._lock:
            subs = list(self._subs.get((namespace, name), ()))
            if cluster:
                subs += self._subs.get((namespace, CLUSTER + cluster), ())
                if namespace in self._pods:  # the first list is how things are, no change
                    key = (namespace, cluster)
                    self._cluster_changes[key] = self._cluster_changes.get(key, 0) + 1
        for sub in subs:
            sub._wake(obj, deleted)

    def _wake_all(self, namespace: str) -> None:
        with self._lock:
            subs = [s for key, group in self._subs.items() if key[0] == namespace for s in group]
        for sub in subs:
            sub._wake(None, False)
