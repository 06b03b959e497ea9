"""The room of the nodes Ray pods run on, for node-aware planning (issue #44 item 3).

A grow its node cannot take is deferred by the kubelet (and kept charged by the scheduler
at its desired size, so it blocks other pods), or refused at admission (Kubernetes 1.36,
403 `NodeCapacity`), and no node autoscaler reacts to it. So the planner grows a pod only
as far as its node has room (`ClusterSnapshot.nodes`), and launches where none has.

A node's room is its allocatable CPU and memory minus what the scheduler charges the pods
bound to it: for each container the larger of its desired (spec), allocated
(`status.containerStatuses[].allocatedResources`) and actual (`...resources`) requests —
so a grow in flight or deferred already holds its room, as KEP-1287 has the scheduler
count it — plus restartable init containers (sidecars), or a larger one-off init
container, plus the pod's overhead. Every pod counts, other workloads' too: the watch of
pods is cluster-wide (RBAC: `nodes` get/list/watch and `pods` list/watch in every
namespace; `docs/design/kubernetes-resize.md` says why).

Two informers (LIST, then WATCH from its resourceVersion with bookmarks; a 410 lists
again), started at the first `rooms` call: one of Nodes (their allocatable), one of the
pods not finished (`status.phase!=Succeeded,status.phase!=Failed`, as the scheduler's own
informer selects), kept as (node, millicores, bytes) per pod and summed per node. A stream
that delivers nothing for `stale_after_s` (a connection dropped on the way and never
closed) times out its read and reconnects; until both informers are current again,
`rooms` answers nothing and the planner grows as it did without nodes (the kubelet defers
what does not fit). A read the server refuses (403: the role lacks the rules) is said once
and tried again every `FORBIDDEN_RETRY_S`.

A room read here may lag the server by the watch's delay: a grow planned on room another
pod took meanwhile is deferred by the kubelet, which the loop hears of and acts on like any
deferred grow. Nothing is ever written from this cache.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from kubernetes.client.exceptions import ApiException

from raysize.activities.kube_limits import KubeLimits, retry_after_of
from raysize.activities.pod_watch import (
    CONNECT_TIMEOUT_S,
    GONE_STATUS,
    STALE_SLACK_S,
    THROTTLED_STATUS,
    WATCH_TIMEOUT_S,
    _RawWatch,
    list_pages,
)
from raysize.workflows.model import NodeRoom
from raysize.workflows.resources import CPU, MEMORY, QuantityError, quantity_to_units

log = logging.getLogger("raysize.activities")

Obj = dict[str, Any]
FORBIDDEN_STATUS = 403
# a role without the rules may be given them later: ask again this often
FORBIDDEN_RETRY_S = 300.0
# the pods the scheduler charges its nodes with (its own informer's selector)
UNFINISHED = "status.phase!=Succeeded,status.phase!=Failed"
NODES = "node-watch"
PODS = "pod-charge-watch"


# Kubernetes' name of each resource the room is kept of, and raysize's (its units)
KUBE_NAMES = {CPU: "cpu", MEMORY: "memory"}


def _units(quantities: Any, name: str) -> int:
    """Resource `name` (CPU, MEMORY) of a Kubernetes requests/limits/allocatable map, in
    units (0 when absent or unreadable)."""
    key = KUBE_NAMES[name]
    if not isinstance(quantities, dict) or quantities.get(key) is None:
        return 0
    try:
        return quantity_to_units(quantities[key], name)
    except QuantityError:
        return 0


def _requests(container: Obj) -> Obj:
    resources = container.get("resources") or {}
    # the API server defaults requests to limits where only limits are set
    return resources.get("requests") or resources.get("limits") or {}


def pod_charge(pod: Obj) -> tuple[str, int, int]:
    """(node, millicores, bytes) the scheduler charges the pod's node with ("" when the
    pod is not bound)."""
    spec = pod.get("spec") or {}
    statuses = {
        cs.get("name"): cs
        for cs in (pod.get("status") or {}).get("containerStatuses") or []
        if isinstance(cs, dict)
    }
    total = [0, 0]
    for c in spec.get("containers") or []:
        cs = statuses.get(c.get("name")) or {}
        for i, name in enumerate((CPU, MEMORY)):
            total[i] += max(
                _units(_requests(c), name),
                _units(cs.get("allocatedResources"), name),
                _units((cs.get("resources") or {}).get("requests"), name),
            )
    sidecars = [0, 0]
    one_off = [0, 0]
    for c in spec.get("initContainers") or []:
        for i, name in enumerate((CPU, MEMORY)):
            wanted = _units(_requests(c), name)
            if c.get("restartPolicy") == "Always":  # a sidecar: runs beside the others
                sidecars[i] += wanted
            else:  # runs alone before them, beside the sidecars started before it
                one_off[i] = max(one_off[i], sidecars[i] + wanted)
    overhead = spec.get("overhead") or {}
    cpu = max(total[0] + sidecars[0], one_off[0]) + _units(overhead, CPU)
    memory = max(total[1] + sidecars[1], one_off[1]) + _units(overhead, MEMORY)
    return str(spec.get("nodeName") or ""), cpu, memory


def node_allocatable(node: Obj) -> tuple[int, int]:
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return _units(allocatable, CPU), _units(allocatable, MEMORY)


class NodeRooms:
    """Nodes' allocatable and their pods' charges, from two cluster-wide watches."""

    def __init__(
        self,
        core: Any,
        *,
        limits: KubeLimits | None = None,
        timeout_s: int = WATCH_TIMEOUT_S,
        stale_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = core
        self.limits = limits
        self.timeout_s = timeout_s
        self.stale_after_s = timeout_s + STALE_SLACK_S if stale_after_s is None else stale_after_s
        self.clock = clock
        self._lock = threading.Lock()
        self._allocatable: dict[str, tuple[int, int]] = {}  # node → (millicores, bytes)
        self._charges: dict[str, tuple[str, int, int]] = {}  # "ns/pod" → `pod_charge`
        self._used: dict[str, list[int]] = {}  # node → [millicores, bytes] charged
        self._synced: set[str] = set()  # the informers that are current (NODES, PODS)
        self._forbidden_until = 0.0
        self._forbidden_said = False
        self._threads: dict[str, threading.Thread] = {}
        self._watches: dict[str, _RawWatch] = {}
        self._stop = threading.Event()
        self._started = 0.0  # `clock` when the informers were started

    # --- what the observe reads --------------------------------------------------------------
    def rooms(self, names: Iterable[str]) -> dict[str, NodeRoom]:
        """The room of each named node, when both informers are current; else nothing
        (the plan then does without). Starts the informers at the first call."""
        self._ensure()
        with self._lock:
            if len(self._synced) < 2:
                return {}
            out: dict[str, NodeRoom] = {}
            for name in sorted(set(names)):
                alloc = self._allocatable.get(name)
                if alloc is None:
                    continue  # a node not seen (yet): no limit known
                used = self._used.get(name, (0, 0))
                out[name] = NodeRoom(cpu=alloc[0] - used[0], memory=alloc[1] - used[1])
            return out

    async def started(self, wait_s: float) -> None:
        """Start the informers if they are not; in their first `wait_s` s, wait (polling,
        on the event loop) until both have listed. Later, or while the server refuses
        them, return at once: a plan never waits on them."""
        self._ensure()
        while not self.synced() and self.clock() - self._started < wait_s:
            if self._forbidden_until > self.clock() or self._stop.is_set():
                return
            await asyncio.sleep(0.05)

    def synced(self) -> bool:
        with self._lock:
            return len(self._synced) == 2

    def state(self) -> dict[str, int]:
        with self._lock:
            return {
                "node_room.nodes": len(self._allocatable),
                "node_room.pods": len(self._charges),
                "node_room.nodes_charged": len(self._used),
            }

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            watches = list(self._watches.values())
        for w in watches:
            w.stop()

    # --- the informers -----------------------------------------------------------------------
    def _ensure(self) -> None:
        if not self._threads:
            self._started = self.clock()
        for name, list_fn, kwargs in (
            (NODES, self.core.list_node, {}),
            (PODS, self.core.list_pod_for_all_namespaces, {"field_selector": UNFINISHED}),
        ):
            with self._lock:
                if name in self._threads or self._stop.is_set():
                    continue
                thread = threading.Thread(
                    target=self._run, args=(name, list_fn, kwargs), name=name, daemon=True
                )
                self._threads[name] = thread
            thread.start()

    def _take(self) -> None:
        if self.limits is not None:
            self.limits.acquire()

    def _synced_now(self, name: str, synced: bool) -> None:
        with self._lock:
            if synced and not self._stop.is_set():
                self._synced.add(name)
            else:
                self._synced.discard(name)

    def _run(self, name: str, list_fn: Callable[..., Any], kwargs: Obj) -> None:
        version = ""  # "": list first; else where the watch resumes (opaque, never ordered)
        backoff = 0.5
        while not self._stop.is_set():
            wait = self._forbidden_until - self.clock()
            if wait > 0:
                self._stop.wait(wait)
                continue
            w = _RawWatch()
            with self._lock:
                self._watches[name] = w
            try:
                if not version:
                    self._take()
                    version = self._list(name, list_fn, kwargs)
                    self._synced_now(name, True)
                self._take()
                for ev in w.stream(
                    list_fn,
                    **kwargs,
                    resource_version=version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=self.timeout_s,
                    # nothing for this long: the stream is dead (dropped, never closed)
                    _request_timeout=(CONNECT_TIMEOUT_S, self.stale_after_s),
                ):
                    kind, obj = ev.get("type"), ev.get("object") or {}
                    meta = obj.get("metadata") or {}
                    version = meta.get("resourceVersion") or version
                    self._synced_now(name, True)  # the server took the version
                    if kind == "BOOKMARK" or not meta.get("name"):
                        continue
                    with self._lock:
                        self._apply(name, obj, deleted=kind == "DELETED")
                    backoff = 0.5
                # the server ended the watch (its timeout, after a bookmark): resume
            except ApiException as exc:
                self._synced_now(name, False)
                if exc.status == GONE_STATUS:
                    log.info("%s: resourceVersion %s is gone (410); listing again", name, version)
                    version = ""
                    continue
                if exc.status == FORBIDDEN_STATUS:
                    self._forbidden(name, exc)
                    version = ""
                    continue
                if exc.status == THROTTLED_STATUS and self.limits is not None:
                    self.limits.throttled(retry_after_of(exc.headers))
                log.info("%s dropped (%s); reconnecting", name, exc.reason)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
            except Exception as exc:  # the connection dropped, or its read timed out
                self._synced_now(name, False)
                if self._stop.is_set():
                    return
                log.info("%s dropped (%s); reconnecting", name, exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
            finally:
                w.stop()
        self._synced_now(name, False)

    def _forbidden(self, name: str, exc: ApiException) -> None:
        self._forbidden_until = self.clock() + FORBIDDEN_RETRY_S
        if not self._forbidden_said:
            self._forbidden_said = True
            log.warning(
                "%s: the API server refused it (403 %s): grows are planned without the "
                "nodes' room (a grow its node cannot take waits, deferred, until it times out). "
                "Grant raysize's role get/list/watch on nodes and list/watch on pods in every "
                "namespace (docs/design/kubernetes-resize.md); asking again every %.0f s",
                name,
                exc.reason,
                FORBIDDEN_RETRY_S,
            )

    def _list(self, name: str, list_fn: Callable[..., Any], kwargs: Obj) -> str:
        """LIST in pages; the store of this informer becomes the list's."""
        items: list[Obj] = []
        version = ""
        for doc in list_pages(list_fn, take=self._take, timeout_s=self.timeout_s, **kwargs):
            meta = doc.get("metadata") or {}
            version = version or str(meta.get("resourceVersion") or "")
            items.extend(doc.get("items") or [])
        if not version:
            raise ValueError(f"{name}: a list without a resourceVersion")
        with self._lock:
            if name == NODES:
                self._allocatable.clear()
            else:
                self._charges.clear()
                self._used.clear()
            for obj in items:
                self._apply(name, obj, deleted=False)
        if self._forbidden_said:
            log.info("%s: the API server answers again; grows are planned on node room", name)
            self._forbidden_said = False
        return version

    def _apply(self, name: str, obj: Obj, *, deleted: bool) -> None:
        """One object into the store (under the lock)."""
        meta = obj.get("metadata") or {}
        if name == NODES:
            if deleted:
                self._allocatable.pop(str(meta["name"]), None)
            else:
                self._allocatable[str(meta["name"])] = node_allocatable(obj)
            return
        key = f"{meta.get('namespace', '')}/{meta['name']}"
        before = self._charges.pop(key, None)
        if before is not None:
            self._charge(before, -1)
        phase = (obj.get("status") or {}).get("phase")
        if deleted or phase in ("Succeeded", "Failed"):
            return
        charge = pod_charge(obj)
        if charge[0]:  # bound to a node
            self._charges[key] = charge
            self._charge(charge, 1)

    def _charge(self, charge: tuple[str, int, int], sign: int) -> None:
        node, cpu, memory = charge
        used = self._used.setdefault(node, [0, 0])
        used[0] += sign * cpu
        used[1] += sign * memory
        if sign < 0 and used == [0, 0]:
            del self._used[node]
