"""The object store behind the API server: etcd's role, in memory.

Every write takes the next global `resourceVersion` (a decimal string, as etcd's
revision), and is published to the watchers whose filter it passes. Stored objects are
never mutated after they are stored; readers may share them, writers get a copy.
"""

from __future__ import annotations

import json
import queue
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from raysize.sandbox.errors import (
    already_exists,
    conflict,
    gone,
    invalid_object,
    not_found,
    required,
)

Obj = dict[str, Any]
WatchEvent = tuple[str, Obj]  # ("ADDED" | "MODIFIED" | "DELETED", object)

HISTORY = 20_000  # watch events kept for `watch?resourceVersion=N`
INITIAL_END = "INITIAL_END"  # a watcher's marker: the synthetic ADDs are all delivered
# The revision a new store starts at. Older ones count as compacted, as on any cluster
# that has run a while, so a watch from e.g. resourceVersion "1" is answered with 410 Gone.
FIRST_REVISION = 100


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def rfc3339_in(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds))


def clone(obj: Obj) -> Obj:
    """A deep copy of a JSON object; faster than `copy.deepcopy` for plain JSON."""
    out: Obj = json.loads(json.dumps(obj))
    return out


def dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


@dataclass(frozen=True)
class ResourceType:
    name: str  # plural, e.g. "pods"
    kind: str
    group: str
    version: str
    namespaced: bool = True
    singular: str = ""
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    verbs: tuple[str, ...] = (
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    )
    categories: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


@dataclass
class _Entry:
    obj: Obj
    raw: bytes | None = None

    def bytes(self) -> bytes:
        if self.raw is None:
            self.raw = dumps(self.obj)
        return self.raw


@dataclass
class Watcher:
    resource: str
    namespace: str | None
    accept: Callable[[Obj], bool]
    events: queue.Queue[WatchEvent | None] = field(default_factory=queue.Queue)
    closed: bool = False

    def close(self) -> None:
        self.closed = True
        self.events.put(None)


_List = list  # `Store.list` shadows the builtin inside the class body
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's utilrand alphabet


class Store:
    def __init__(self, history: int = HISTORY) -> None:
        self.lock = threading.RLock()
        self._rv = FIRST_REVISION
        self._objects: dict[str, dict[tuple[str, str], _Entry]] = {}
        self._history: deque[tuple[int, str, str, Obj]] = deque(maxlen=history)
        # the newest revision that fell out of the history: a watch from before it is
        # gone (410). Like the real server's watch cache, which holds every event since it
        # started until its window fills, a watch from before the first event replays all.
        self._dropped = 0
        self._watchers: list[Watcher] = []
        self._random = random.Random()
        # (resource, label) → (namespace, value) → names, kept by _publish under the lock:
        # the KubeRay stand-in reads a cluster's pods without scanning 10,000 of them
        self._index: dict[tuple[str, str], dict[tuple[str, str], set[str]]] = {
            key: {} for key in INDEXED_LABELS
        }
        self._indexed_as: dict[tuple[str, str, str, str], str] = {}

    # --- reads --------------------------------------------------------------------------
    @property
    def resource_version(self) -> str:
        return str(self._rv)

    def get(self, resource: str, namespace: str, name: str, *, kind: str = "") -> Obj:
        with self.lock:
            entry = self._objects.get(resource, {}).get((namespace, name))
            if entry is None:
                raise not_found(kind if kind else resource, name, _group_of(resource))
            return entry.obj

    def find(self, resource: str, namespace: str, name: str) -> Obj | None:
        with self.lock:
            entry = self._objects.get(resource, {}).get((namespace, name))
            return None if entry is None else entry.obj

    def list(
        self,
        resource: str,
        namespace: str | None = None,
        accept: Callable[[Obj], bool] | None = None,
    ) -> tuple[_List[Obj], str]:
        items, rv = self.list_raw(resource, namespace, accept)
        return [e.obj for e in items], rv

    def compacted(self, rv: int) -> bool:
        """Whether revision `rv` is older than the history kept (a watch from it, or a list
        continued from it, is answered 410 Gone)."""
        with self.lock:
            return rv < max(self._dropped, FIRST_REVISION)

    def list_raw(
        self,
        resource: str,
        namespace: str | None = None,
        accept: Callable[[Obj], bool] | None = None,
    ) -> tuple[_List[_Entry], str]:
        with self.lock:
            entries = self._objects.get(resource, {})
            out = [
                e
                for (ns, _), e in sorted(entries.items(), key=lambda kv: kv[0])
                if (namespace is None or ns == namespace) and (accept is None or accept(e.obj))
            ]
            return out, str(self._rv)

    def labelled(self, resource: str, namespace: str, label: str, value: str) -> _List[Obj]:
        """The objects of `resource` in `namespace` whose `label` is `value`, by name, from
        the index (`INDEXED_LABELS`): what `list(resource, namespace, accept)` with that
        label's test returns, without a scan."""
        if (resource, label) not in self._index:
            raise ValueError(f"label {label!r} of {resource} is not indexed: see INDEXED_LABELS")
        with self.lock:
            names = self._index[(resource, label)].get((namespace, value), ())
            entries = self._objects.get(resource, {})
            return [entries[(namespace, n)].obj for n in sorted(names)]

    def raw(self, obj: Obj) -> bytes:
        """The cached JSON of a stored object (or a fresh encoding of any other)."""
        meta = obj.get("metadata", {})
        with self.lock:
            for entries in self._objects.values():
                entry = entries.get((meta.get("namespace", ""), meta.get("name", "")))
                if entry is not None and entry.obj is obj:
                    return entry.bytes()
        return dumps(obj)

    # --- writes -------------------------------------------------------------------------
    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def create(self, resource: str, namespace: str, obj: Obj) -> Obj:
        with self.lock:
            meta = obj.setdefault("metadata", {})
            if not meta.get("name"):
                prefix = meta.get("generateName")
                if not prefix:
                    raise invalid_object(
                        _kind_of(obj),
                        "",
                        [required("metadata.name", "name or generateName is required")],
                    )
                entries = self._objects.setdefault(resource, {})
                while True:
                    suffix = "".join(self._random.choice(_NAME_CHARS) for _ in range(5))
                    if (namespace, prefix + suffix) not in entries:
                        break
                meta["name"] = prefix + suffix
            name = meta["name"]
            entries = self._objects.setdefault(resource, {})
            if (namespace, name) in entries:
                raise already_exists(resource, name, _group_of(resource))
            if namespace:
                meta["namespace"] = namespace
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_rfc3339()
            meta["resourceVersion"] = self._next_rv()
            meta.pop("deletionTimestamp", None)
            entries[(namespace, name)] = _Entry(obj)
            self._publish(resource, "ADDED", obj)
            return obj

    def update(
        self,
        resource: str,
        namespace: str,
        name: str,
        mutate: Callable[[Obj], Obj],
    ) -> Obj:
        """Read-modify-write under the lock. `mutate` gets a copy and returns the new object.

        An object equal to the stored one is not written (no new resourceVersion), like the
        real server's no-op updates.
        """
        with self.lock:
            entry = self._objects.get(resource, {}).get((namespace, name))
            if entry is None:
                raise not_found(resource, name, _group_of(resource))
            current = entry.obj
            new = mutate(clone(current))
            new.setdefault("metadata", {})["resourceVersion"] = current["metadata"][
                "resourceVersion"
            ]
            if new == current:
                return current
            new["metadata"]["resourceVersion"] = self._next_rv()
            meta = new["metadata"]
            if (
                meta.get("deletionTimestamp")
                and not meta.get("finalizers")
                and (meta.get("deletionGracePeriodSeconds") in (None, 0))
            ):
                del self._objects[resource][(namespace, name)]
                self._publish(resource, "DELETED", new)
                return new
            self._objects[resource][(namespace, name)] = _Entry(new)
            self._publish(resource, "MODIFIED", new)
            return new

    def remove(
        self,
        resource: str,
        namespace: str,
        name: str,
        *,
        finalize: bool = True,
        uid: str | None = None,
    ) -> Obj:
        """Delete now: the object leaves the store, unless it has finalizers. `uid`: a
        precondition, as a DELETE's `preconditions.uid` (409 if another object of the name
        is there now: one deleted and then created again).

        An object with finalizers is only marked (`markAsDeleting`): deletionTimestamp now
        (or kept if earlier), deletionGracePeriodSeconds 0, generation bumped the first
        time. It leaves when an update empties its finalizers. `finalize=False` removes it
        regardless (the sandbox's namespace deletion, which does the namespace
        controller's work at once).
        """
        with self.lock:
            entry = self._objects.get(resource, {}).get((namespace, name))
            if entry is None:
                raise not_found(resource, name, _group_of(resource))
            held = entry.obj["metadata"].get("uid")
            if uid is not None and uid != held:
                raise conflict(
                    _kind_of(entry.obj),
                    name,
                    _group_of(resource),
                    f"the UID in the precondition ({uid}) does not match the UID in record "
                    f"({held}). The object might have been deleted and then recreated",
                )
            if finalize and entry.obj["metadata"].get("finalizers"):
                return self._mark_deleting(resource, namespace, name)
            del self._objects[resource][(namespace, name)]
            obj = clone(entry.obj)
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._publish(resource, "DELETED", obj)
            return obj

    def _mark_deleting(self, resource: str, namespace: str, name: str) -> Obj:
        """`markAsDeleting` as an update: the finalizers stay, so the object stays too."""

        def mark(obj: Obj) -> Obj:
            meta = obj["metadata"]
            now = now_rfc3339()
            if not meta.get("deletionTimestamp"):
                if meta.get("generation", 0) > 0:
                    meta["generation"] += 1
                meta["deletionTimestamp"] = now
            elif meta["deletionTimestamp"] > now:  # RFC 3339 in UTC sorts as time
                meta["deletionTimestamp"] = now
            meta["deletionGracePeriodSeconds"] = 0
            return obj

        return self.update(resource, namespace, name, mark)

    # --- watch --------------------------------------------------------------------------
    def _reindex(self, resource: str, kind: str, obj: Obj) -> None:
        meta = obj["metadata"]
        ns, name = meta.get("namespace", ""), meta["name"]
        for res, label in INDEXED_LABELS:
            if res != resource:
                continue
            index = self._index[(res, label)]
            old = self._indexed_as.pop((res, label, ns, name), None)
            if old is not None:
                names = index[(ns, old)]
                names.discard(name)
                if not names:
                    del index[(ns, old)]
            value = (meta.get("labels") or {}).get(label)
            if kind != "DELETED" and value is not None:
                index.setdefault((ns, value), set()).add(name)
                self._indexed_as[(res, label, ns, name)] = value

    def _publish(self, resource: str, kind: str, obj: Obj) -> None:
        self._reindex(resource, kind, obj)
        rv = int(obj["metadata"]["resourceVersion"])
        if len(self._history) == self._history.maxlen:
            self._dropped = self._history[0][0]
        self._history.append((rv, resource, kind, obj))
        for w in self._watchers:
            if w.resource != resource or w.closed:
                continue
            if w.namespace is not None and obj["metadata"].get("namespace", "") != w.namespace:
                continue
            if not w.accept(obj):
                continue
            w.events.put((kind, obj))

    def watch(
        self,
        resource: str,
        namespace: str | None,
        accept: Callable[[Obj], bool],
        since: str | None,
        mark_initial_end: bool = False,
    ) -> Watcher:
        """Watch from `since` (exclusive); `None`/"0"/"" means "from now" after synthetic ADDs
        (followed by an INITIAL_END marker carrying the revision, if `mark_initial_end`)."""
        w = Watcher(resource, namespace, accept)
        with self.lock:
            if since in (None, "", "0"):
                for (ns, _), e in sorted(self._objects.get(resource, {}).items()):
                    if (namespace is None or ns == namespace) and accept(e.obj):
                        w.events.put(("ADDED", e.obj))
                if mark_initial_end:
                    w.events.put((INITIAL_END, {"metadata": {"resourceVersion": str(self._rv)}}))
            else:
                try:
                    start = int(since)
                except ValueError as exc:
                    raise gone(f"too old resource version: {since}") from exc
                if start < self._dropped:
                    raise gone(f"too old resource version: {start} ({self._dropped})")
                for rv, res, kind, obj in self._history:
                    if (
                        rv > start
                        and res == resource
                        and accept(obj)
                        and (namespace is None or obj["metadata"].get("namespace", "") == namespace)
                    ):
                        w.events.put((kind, obj))
            self._watchers.append(w)
        return w

    def unwatch(self, w: Watcher) -> None:
        with self.lock:
            if w in self._watchers:
                self._watchers.remove(w)
        w.close()

    def iter_all(self, resource: str) -> Iterator[Obj]:
        with self.lock:
            yield from [e.obj for e in self._objects.get(resource, {}).values()]


# labels `Store.labelled` answers from an index: (resource, label key)
INDEXED_LABELS = (("pods", "ray.io/cluster"),)

_GROUPS = {
    "rayclusters": "ray.io",
    # sandbox.generic's kinds (GROUP_OF there; a test keeps the two equal)
    "deployments": "apps",
    "roles": "rbac.authorization.k8s.io",
    "rolebindings": "rbac.authorization.k8s.io",
    "clusterroles": "rbac.authorization.k8s.io",
    "clusterrolebindings": "rbac.authorization.k8s.io",
    "validatingadmissionpolicies": "admissionregistration.k8s.io",
    "validatingadmissionpolicybindings": "admissionregistration.k8s.io",
    "mutatingadmissionpolicies": "admissionregistration.k8s.io",
    "mutatingadmissionpolicybindings": "admissionregistration.k8s.io",
    "poddisruptionbudgets": "policy",
}


def _group_of(resource: str) -> str:
    return _GROUPS.get(resource, "")


def _kind_of(obj: Obj) -> str:
    return str(obj.get("kind", "Object"))
