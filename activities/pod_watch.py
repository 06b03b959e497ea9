"""One Kubernetes watch per namespace, shared by every activity that waits on a pod.

A resize saga waits for the kubelet to act on its pod. Polling each pod (GET every
0.2 s) costs a thousand concurrent resizes 5,000 requests a second — more than a real API
server lets one client make, and most of the worker's CPU. Instead the worker keeps one
watch on the pods of each namespace it waits in and hands each change of a pod to the
activities waiting on it. An activity reads the pod itself only when it starts, after
the watch reconnects, and when nothing was heard for its poll interval (a silent or
dropped watch must never leave a resize waiting forever).

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kubernetes import watch

log = logging.getLogger("raysize.activities")

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

    def __init__(self, core: Any, custom: Any = None, *, timeout_s: int = 300) -> None:
        self.core = core
        self.custom = custom
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._subs: dict[Key, list[Subscription]] = {}
        # the newest resourceVersion seen for each cluster's pods (a DELETED counts too)
        self._cluster_versions: dict[tuple[str, str], int] = {}
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

    def cluster_changed_since(
        self, namespace: str, cluster: str, version: str, mark: str = ""
    ) -> bool:
        """Has a pod of the cluster changed after `version` (a list's resourceVersion), or
        the RayCluster since it had `mark` (`raycluster_mark`; empty: not asked)?

        The watch's first events are every object as it is, each pod with the version of
        its last change, so a change made before the watch began counts as well. A version
        that is not a number (the API server's are) tells nothing about pods."""
        key = (namespace, cluster)
        with self._lock:
            seen = self._cluster_marks.get(key)
            if mark and seen is not None and seen != mark:
                return True
            try:
                since = int(version)
            except ValueError:
                return False
            return self._cluster_versions.get(key, 0) > since

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
        watches: list[tuple[str, Callable[..., Any], tuple[Any, ...], Deliver]] = [
            (f"pod-watch-{namespace}", self.core.list_namespaced_pod, (namespace,), self._deliver)
        ]
        if self.custom is not None:
            watches.append(
                (
                    f"raycluster-watch-{namespace}",
                    self.custom.list_namespaced_custom_object,
                    ("ray.io", "v1", namespace, "rayclusters"),
                    self._deliver_cluster,
                )
            )
        for name, list_fn, args, deliver in watches:
            with self._lock:
                if name in self._threads or self._stop.is_set():
                    continue
                thread = threading.Thread(
                    target=self._run,
                    args=(namespace, name, list_fn, args, deliver),
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
    ) -> None:
        version: str | None = None  # None: start with the current state of every object
        backoff = 0.5
        while not self._stop.is_set():
            w = watch.Watch()
            with self._lock:
                self._watches[name] = w
            try:
                for ev in w.stream(
                    list_fn,
                    *args,
                    resource_version=version,
                    timeout_seconds=self.timeout_s,
                    _request_timeout=self.timeout_s + 30,
                    deserialize=False,
                ):
                    kind, obj = ev.get("type"), ev.get("object") or {}
                    if kind == "ERROR":  # 410 Gone: our version is too old, start over
                        version = None
                        break
                    meta = obj.get("metadata") or {}
                    version = meta.get("resourceVersion") or version
                    if not meta.get("name") or kind == "BOOKMARK":
                        continue
                    deliver(namespace, meta["name"], obj, meta, kind == "DELETED")
                    backoff = 0.5
            except Exception as exc:  # the connection dropped: everyone looks again
                if self._stop.is_set():
                    return
                log.info("%s dropped (%s); reconnecting", name, exc)
                version = None
                self._wake_all(namespace)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
            finally:
                w.stop()

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
                with contextlib.suppress(TypeError, ValueError):
                    version = int(meta.get("resourceVersion") or "")
                    key = (namespace, cluster)
                    self._cluster_versions[key] = max(self._cluster_versions.get(key, 0), version)
        for sub in subs:
            sub._wake(obj, deleted)

    def _wake_all(self, namespace: str) -> None:
        with self._lock:
            subs = [s for key, group in self._subs.items() if key[0] == namespace for s in group]
        for sub in subs:
            sub._wake(None, False)
