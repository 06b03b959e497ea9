"""One Kubernetes watch per namespace, shared by every activity that waits on a pod.

A resize saga waits for the kubelet to act on its pod. Polling each pod (GET every
0.2 s) costs a thousand concurrent resizes 5,000 requests a second — more than a real API
server lets one client make, and most of the worker's CPU. Instead the worker keeps one
watch on the pods of each namespace it waits in and hands each change of a pod to the
activities waiting on it. An activity reads the pod itself only when it starts, after
the watch reconnects, and when nothing was heard for its poll interval (a silent or
dropped watch must never leave a resize waiting forever).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kubernetes import watch

log = logging.getLogger("raysize.activities")

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, pod), or (namespace, CLUSTER + cluster) for a cluster
CLUSTER = "cluster:"  # pod names never contain ':'
CLUSTER_LABEL = "ray.io/cluster"


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

    def __init__(self, core: Any, *, timeout_s: int = 300) -> None:
        self.core = core
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._subs: dict[Key, list[Subscription]] = {}
        # the newest resourceVersion seen for each cluster's pods (a DELETED counts too)
        self._cluster_versions: dict[tuple[str, str], int] = {}
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

    def cluster_changed_since(self, namespace: str, cluster: str, version: str) -> bool:
        """Has a pod of the cluster changed after `version` (a list's resourceVersion)?

        The watch's first events are every pod as it is, each with the version of its
        last change, so a change made before the watch began counts as well. A version
        that is not a number (the API server's are) tells nothing: False."""
        try:
            since = int(version)
        except ValueError:
            return False
        with self._lock:
            return self._cluster_versions.get((namespace, cluster), 0) > since

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
        with self._lock:
            if namespace in self._threads or self._stop.is_set():
                return
            thread = threading.Thread(
                target=self._run, args=(namespace,), name=f"pod-watch-{namespace}", daemon=True
            )
            self._threads[namespace] = thread
        thread.start()

    def _run(self, namespace: str) -> None:
        version: str | None = None  # None: start with the current state of every pod
        backoff = 0.5
        while not self._stop.is_set():
            w = watch.Watch()
            with self._lock:
                self._watches[namespace] = w
            try:
                for ev in w.stream(
                    self.core.list_namespaced_pod,
                    namespace,
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
                    name = meta.get("name")
                    if not name:
                        continue
                    self._deliver(namespace, name, obj, meta, kind == "DELETED")
                    backoff = 0.5
            except Exception as exc:  # the connection dropped: everyone looks again
                if self._stop.is_set():
                    return
                log.info("pod watch in %s dropped (%s); reconnecting", namespace, exc)
                version = None
                self._wake_all(namespace)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
            finally:
                w.stop()

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
