"""The kubelet simulator: runs the pods bound to its nodes, reports its nodes' status,
and actuates resizes. Where no scheduler runs (the embedded world: `schedules=True`) it
also binds pods to its nodes itself; in the real world kube-scheduler binds them.

Its nodes are registered at start and their status posted again every
`node_status_interval_s` (the Ready condition's heartbeat), as a kubelet does. With
`adopts`, it also runs the Nodes others make that the predicate accepts, as kwok fakes
the Nodes Karpenter's kwok provider creates: from the Node's ADDED event on, it posts
their status (Ready, with the capacity and allocatable the Node was made with) and runs
the pods bound to them; a deleted one is let go, with what ran on it.

Each resize follows docs/design/kubernetes-resize.md §2 in order: the API server bumps the
generation; the kubelet either sets `PodResizePending` (Deferred or Infeasible, with the
kubelet's exact messages) or accepts (`allocatedResources` + `PodResizeInProgress`); after the
actuation delay, `containerStatuses[].resources` take the new values and the condition goes away.
A memory limit below current usage leaves `PodResizeInProgress` with reason `Error`.
Every pod update queues the resize it asks for and retries the whole queue once, in the
kubelet's order (non-increasing first, priority, Guaranteed, longest pending); so do pods
added, pods removed, a resize finishing, and a ticker. A pod's requests are those of
`resourcehelper.PodRequests`: containers plus sidecars (restartable init containers), or
an init container next to the sidecars before it if that is more; sidecars are resized,
and reported in `initContainerStatuses`, like containers. A pod whose
`activeDeadlineSeconds` runs out is Failed and frees its resources without a retry
trigger (the 1.35 kubelet has no `pod_terminated` trigger).

Memory usage is simulated per pod with the annotation `sandbox.raysize.io/memory-usage`
(a quantity for every container, or `name=quantity,...`).
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import json
import logging
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from raysize.sandbox import pods as podlib
from raysize.sandbox.errors import ApiError
from raysize.sandbox.quantity import canonical
from raysize.sandbox.store import Obj, Watcher, now_rfc3339
from raysize.workflows.resources import CPU, MEMORY, quantity_to_units, units_to_quantity

log = logging.getLogger(__name__)

MEMORY_USAGE_ANNOTATION = "sandbox.raysize.io/memory-usage"
PENDING = "PodResizePending"
IN_PROGRESS = "PodResizeInProgress"
KUBELET_VERSION = "v1.35.0-raysize-sandbox"
# the kubelet's crash-loop back-off: the first restart at once, then 10 s doubling to 5 min
BACKOFF_INITIAL_S = 10.0
BACKOFF_MAX_S = 300.0


class PodStore(Protocol):
    """What the kubelet reads and writes: the embedded `Store`, or any API server through
    `sandbox.apistore.ApiStore` (the kubelet is then a client like a real one)."""

    def find(self, resource: str, namespace: str, name: str) -> Obj | None: ...

    def get(self, resource: str, namespace: str, name: str) -> Obj: ...

    def create(self, resource: str, namespace: str, obj: Obj) -> Obj: ...

    def update(
        self, resource: str, namespace: str, name: str, mutate: Callable[[Obj], Obj]
    ) -> Obj: ...

    def remove(
        self, resource: str, namespace: str, name: str, *, uid: str | None = None
    ) -> Obj: ...

    def watch(
        self,
        resource: str,
        namespace: str | None,
        accept: Callable[[Obj], bool],
        since: str | None,
    ) -> Watcher: ...

    def unwatch(self, w: Watcher) -> None: ...


# report(namespace, pod, pod uid, container, exit code): a container's process ended by
# itself (not stopped by the kubelet); a signal's death is 128 + its number, as in a shell
ExitReport = Callable[[str, str, str, str, int], None]
# (namespace, pod, uid, init container, exit code): a run-to-completion init container ended
InitReport = Callable[[str, str, str, str, int], None]


class PodRuntime(Protocol):
    """What runs a pod's containers (nothing, real Ray processes, or the pod's own
    containers in its own network namespace)."""

    def start(self, pod: Obj) -> str | None:
        """Start the pod's containers; the pod's IP if the runtime gave it one."""
        ...

    def stop_all(self, pods: list[Obj]) -> None:
        """Stop these pods' containers together (one pod, or the kubelet shutting down)."""
        ...

    def on_exit(self, report: ExitReport) -> None:
        """Tell `report` of every container process that ends by itself."""
        ...

    def restart(self, pod: Obj, container: str) -> None:
        """Run one container of a started pod again (its restartPolicy says so)."""
        ...


def runs_init_containers(runtime: PodRuntime, pod: Obj) -> list[str]:
    """The run-to-completion init containers that `runtime` runs and reports the end of
    (`on_init`), in order; none: the pod's containers start at once."""
    commands = getattr(runtime, "init_containers", None)
    return list(commands(pod)) if commands is not None else []


class NoRuntime:
    def start(self, pod: Obj) -> str | None:
        return None

    def stop_all(self, pods: list[Obj]) -> None:
        return None

    def on_exit(self, report: ExitReport) -> None:
        return None

    def restart(self, pod: Obj, container: str) -> None:
        return None


@dataclass(frozen=True)
class NodeSpec:
    name: str
    cpu: int  # millicores
    memory: int  # bytes
    supports_resize: bool = True
    max_pods: int = 110
    # the container runtime never applies a resize: it stays InProgress (to test timeouts)
    stalls_actuation: bool = False


@dataclass
class KubeletTiming:
    actuation_delay_s: float = 0.0
    retry_initial_s: float = 30.0  # the allocation manager's initialRetryDelay
    retry_interval_s: float = 180.0  # ... and its retryDelay
    sync_interval_s: float = 10.0  # periodic pod sync: retries failed actuation
    # the kubelet's nodeStatusUpdateFrequency: the Ready condition's heartbeat, which
    # also keeps a node lifecycle controller (if one runs) from marking the node Unknown
    node_status_interval_s: float = 10.0


Amounts = dict[str, int]  # "cpu" → millicores, "memory" → bytes
ContainerAlloc = dict[str, dict[str, Amounts]]  # container → {"requests": .., "limits": ..}


def cluster_ip(node_index: int, i: int) -> str:
    """The pod IP of the kubelet's `i`th pod (counted over all nodes), on its node's /24
    (10.244.<node>.<i>) while `i` < 256; past that one of 10.245.0.0 and up, counted on:
    a valid address for each of the next ~700,000 pods (a 5,000-pod cluster's 256th pod
    was refused by kube-apiserver as 10.244.0.256)."""
    if i < 256:
        return f"10.244.{node_index}.{i}"
    j = i - 256
    return f"10.{245 + j // 65536}.{(j // 256) % 256}.{j % 256}"


def _amounts(rl: dict[str, Any] | None) -> Amounts:
    out: Amounts = {}
    for key, unit in (("cpu", CPU), ("memory", MEMORY)):
        if rl and key in rl:
            out[key] = quantity_to_units(rl[key], unit)
    return out


def _resizable(pod: Obj) -> list[Obj]:
    """The containers a resize can change: regular containers and sidecars (restartable
    init containers); in 1.35 other init containers cannot be resized."""
    spec = pod.get("spec") or {}
    sidecars = [c for c in spec.get("initContainers") or [] if podlib.is_sidecar(c)]
    return [*sidecars, *(spec.get("containers") or [])]


def _desired(pod: Obj) -> ContainerAlloc:
    out: ContainerAlloc = {}
    for c in _resizable(pod):
        res = c.get("resources") or {}
        out[c["name"]] = {
            "requests": _amounts(res.get("requests")),
            "limits": _amounts(res.get("limits")),
        }
    return out


@dataclass(frozen=True)
class _InitSlot:
    """One init container, in order: a sidecar (sized by the allocation) or a run-to-
    completion init container (its requests cannot change)."""

    name: str
    sidecar: bool
    requests: Amounts


def _init_layout(pod: Obj) -> tuple[_InitSlot, ...]:
    return tuple(
        _InitSlot(
            c["name"],
            podlib.is_sidecar(c),
            {} if podlib.is_sidecar(c) else _amounts((c.get("resources") or {}).get("requests")),
        )
        for c in (pod.get("spec") or {}).get("initContainers") or []
    )


def _pod_requests(alloc: ContainerAlloc, init: tuple[_InitSlot, ...] = ()) -> Amounts:
    """What the pod asks of its node (`resourcehelper.PodRequests`): its containers and
    sidecars together, or, if larger, what an init container needs next to the sidecars
    started before it."""
    total: Amounts = {"cpu": 0, "memory": 0}
    for parts in alloc.values():
        for k, v in parts["requests"].items():
            total[k] += v
    sidecars: Amounts = {"cpu": 0, "memory": 0}
    for slot in init:
        if slot.sidecar:
            for k, v in (alloc.get(slot.name) or {}).get("requests", {}).items():
                sidecars[k] += v
        else:
            for k in total:
                total[k] = max(total[k], slot.requests.get(k, 0) + sidecars[k])
    return total


def requests_of(pod: Obj) -> Amounts:
    """The pod's requests as its node counts them (millicores, bytes)."""
    return _pod_requests(_desired(pod), _init_layout(pod))


def _rl_json(amounts: Amounts) -> dict[str, str]:
    return {
        k: units_to_quantity(amounts[k], CPU if k == "cpu" else MEMORY) for k in sorted(amounts)
    }


def _resources_json(parts: dict[str, Amounts]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if parts["limits"]:
        out["limits"] = _rl_json(parts["limits"])
    if parts["requests"]:
        out["requests"] = _rl_json(parts["requests"])
    return out


@dataclass
class _PodState:
    node: str
    allocated: ContainerAlloc
    init: tuple[_InitSlot, ...] = ()
    started: bool = False
    finished: bool = False  # terminal (Failed): holds no resources, takes no resizes
    actuate_at: float | None = None
    last_error: str = ""
    seen: tuple[Any, ...] | None = None  # spec, labels, annotations at the last update
    restarts: dict[str, int] = field(default_factory=dict)  # container → restarts so far
    initializing: list[str] = field(default_factory=list)  # init containers still to end
    pending_reported: tuple[str, int] | None = None  # the PodResizePending last written
    run_when_initialized: Callable[[], None] | None = None
    total: Amounts = field(default_factory=dict)  # the pod's allocated requests (as tracked)
    slots: int = 0  # pods it counts for on its node (as tracked)
    # the resources the pod's spec asks for, where a resize made them differ from the
    # allocation (None: the same), and whether that resize is Infeasible: what the
    # scheduler stand-in charges the pod (`_charged`)
    desired: ContainerAlloc | None = None
    infeasible: bool = False
    charge: Amounts = field(default_factory=dict)  # the scheduler's charge (as tracked)

    @staticmethod
    def of(node: str, pod: Obj) -> _PodState:
        return _PodState(node, _desired(pod), _init_layout(pod))


def _charged(state: _PodState) -> Amounts:
    """What kube-scheduler charges a pod on its node (`resourcehelper.PodRequests` with
    the status resources, KEP-1287): per container, the larger of its desired and its
    allocated requests, so a Deferred grow holds its room; an Infeasible resize's desired
    requests are not charged. (The actual requests, the third of the real scheduler's
    terms, equal the allocated ones here except during a resize's actuation delay.)"""
    if state.finished:
        return {"cpu": 0, "memory": 0}
    if state.desired is None or state.infeasible:
        return _pod_requests(state.allocated, state.init)
    larger: ContainerAlloc = {}
    for name, parts in state.allocated.items():
        requests = dict(parts["requests"])
        for k, v in (state.desired.get(name) or {}).get("requests", {}).items():
            requests[k] = max(requests.get(k, 0), v)
        larger[name] = {"requests": requests, "limits": parts["limits"]}
    return _pod_requests(larger, state.init)


@dataclass(order=True)
class _Timer:
    at: float
    seq: int
    action: Callable[[], None] = field(compare=False)


class Kubelet:
    def __init__(
        self,
        store: PodStore,
        nodes: list[NodeSpec],
        timing: KubeletTiming | None = None,
        runtime: PodRuntime | None = None,
        pod_ip: Callable[[NodeSpec, int], str] | None = None,
        *,
        schedules: bool,
        adopts: Callable[[Obj], bool] | None = None,
    ) -> None:
        """`schedules`: bind pods that have no node to one of this kubelet's nodes (first
        fit), for a world without a scheduler (the embedded one); False where
        kube-scheduler binds them (the real world): a pod is then this kubelet's once it
        is bound to one of its nodes. `adopts`: which Nodes made by others (a node
        autoscaler's) this kubelet runs too, sized by their allocatable."""
        self.store = store
        self.schedules = schedules
        self.adopts = adopts
        self.nodes = {n.name: n for n in nodes}
        # each node's index in its pods' IPs (10.244.<index>.x), never reused: adopted
        # nodes come and go
        self._node_index = {name: i for i, name in enumerate(self.nodes)}
        self._adopted: set[str] = set()
        # pods bound to a node this kubelet does not run (yet): an adopted node's pods may
        # be bound before its ADDED event reaches the kubelet
        self._bound_elsewhere: dict[tuple[str, str], str] = {}
        self._node_watcher: Watcher | None = None
        self.timing = timing or KubeletTiming()
        self.runtime: PodRuntime = runtime or NoRuntime()
        self._pod_ip = pod_ip or self._cluster_ip
        self._pods: dict[tuple[str, str], _PodState] = {}
        self._node_used: dict[str, Amounts] = {}
        self._node_charged: dict[str, Amounts] = {}  # the scheduler stand-in's view
        self._node_count: dict[str, int] = {}
        # the queue of resizes to retry (podsWithPendingResizes) and, for its order, when
        # each pod's PodResizePending condition appeared (the kubelet's in-memory time)
        self._deferred: set[tuple[str, str]] = set()
        # pods allocated a resize not yet actuated: what the periodic sync looks at (it
        # read every pod, one GET each in the real world: 5,000 a pass, longer than a pass)
        self._to_actuate: set[tuple[str, str]] = set()
        self._pending_since: dict[tuple[str, str], float] = {}
        self._in_retry = False
        # status changes being collected for one write: (pod key, changes)
        self._batch: tuple[tuple[str, str], list[Callable[[Obj], Obj | None]]] | None = None
        self._unscheduled: set[tuple[str, str]] = set()
        self._timers: list[_Timer] = []
        self._seq = itertools.count()
        self._ips = itertools.count(2)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watcher: Watcher | None = None
        self._calls: queue.Queue[Callable[[], None]] = queue.Queue()
        self.errors: list[str] = []
        self.runtime.on_exit(
            lambda ns, name, uid, container, code: self.call(
                lambda: self._container_exited((ns, name), uid, container, code)
            )
        )
        on_ready = getattr(self.runtime, "on_ready", None)
        if on_ready is not None:  # the runtime runs the readiness probes
            on_ready(
                lambda ns, name, uid, container, ready: self.call(
                    lambda: self._readiness((ns, name), uid, container, ready)
                )
            )
        on_init = getattr(self.runtime, "on_init", None)
        if on_init is not None:
            on_init(
                lambda ns, name, uid, container, code: self.call(
                    lambda: self._init_container_ended((ns, name), uid, container, code)
                )
            )

    def _cluster_ip(self, node: NodeSpec, i: int) -> str:
        return cluster_ip(self._node_index[node.name], i)

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> Kubelet:
        for node in self.nodes.values():
            if self.store.find("nodes", "", node.name) is None:
                self.store.create("nodes", "", _node_object(node))
            else:  # registered before (a kubelet restarted): its status is ours to post
                self._post_node_status(node)
        if self.adopts is not None:
            self._node_watcher = self.store.watch("nodes", None, self.adopts, None)
        self._watcher = self.store.watch("pods", None, lambda o: True, None)
        self._thread = threading.Thread(target=self._run, name="sandbox-kubelet", daemon=True)
        self._thread.start()
        self._after(self.timing.retry_initial_s, self._retry_ticker)
        self._after(self.timing.sync_interval_s, self._sync_ticker)
        self._after(self.timing.node_status_interval_s, self._node_status_ticker)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._node_watcher is not None:
            self.store.unwatch(self._node_watcher)
        if self._watcher is not None:
            self.store.unwatch(self._watcher)
        if self._thread is not None:
            self._thread.join(timeout=10)
        pods = [
            pod
            for (ns, name), _ in list(self._pods.items())
            if (pod := self.store.find("pods", ns, name)) is not None
        ]
        try:
            self.runtime.stop_all(pods)  # all at once: one grace period, not one per pod
        except Exception as exc:
            log.exception("stopping %d pods", len(pods))
            self.errors.append(repr(exc))

    def call(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the kubelet thread (all kubelet state is touched only there)."""
        self._calls.put(fn)

    def retry_deferred_now(self) -> None:
        """What the retry ticker does, on demand."""
        self.call(lambda: self._retry_deferred("ticker"))

    def actuate_held_now(self) -> None:
        """Every resize held by `timing.actuation_delay_s` is actuated now, not when its
        delay ends: a test holds a resize for as long as it needs, then lets it go."""

        def release() -> None:
            for key in list(self._to_actuate):
                state = self._pods.get(key)
                if state is not None:
                    state.actuate_at = None
                self._maybe_actuate(key)

        self.call(release)

    def _after(self, delay: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._timers, _Timer(time.monotonic() + delay, next(self._seq), action))

    def _run(self) -> None:
        assert self._watcher is not None
        while not self._stop.is_set():
            now = time.monotonic()
            while self._timers and self._timers[0].at <= now:
                self._safely(heapq.heappop(self._timers).action)
            while True:
                try:
                    self._safely(self._calls.get_nowait())
                except queue.Empty:
                    break
            while self._node_watcher is not None:
                try:
                    node_event = self._node_watcher.events.get_nowait()
                except queue.Empty:
                    break
                if node_event is not None:
                    self._safely(functools.partial(self._on_node_event, *node_event))
            wait = 0.05
            if self._timers:
                wait = max(0.0, min(wait, self._timers[0].at - time.monotonic()))
            try:
                item = self._watcher.events.get(timeout=wait)
            except queue.Empty:
                continue
            if item is None:
                return
            kind, obj = item
            self._safely(functools.partial(self._on_pod_event, kind, obj))

    def _safely(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # a simulator bug must be visible, not kill the kubelet
            log.exception("kubelet simulator error")
            self.errors.append(repr(exc))

    # --- pod events ---------------------------------------------------------------------
    def _on_pod_event(self, kind: str, event_obj: Obj) -> None:
        meta = event_obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        if kind == "DELETED":
            self._unscheduled.discard(key)
            self._bound_elsewhere.pop(key, None)
            if self._forget(key, event_obj):
                self._schedule_pending()
                self._retry_deferred("pods_removed")
            return
        pod = self.store.find("pods", *key)
        if pod is None or pod["metadata"]["uid"] != meta["uid"]:
            return
        if pod["metadata"].get("deletionTimestamp"):
            self._terminate(key, pod)
            return
        if not (pod.get("spec") or {}).get("nodeName"):
            if self.schedules:
                self._schedule(key, pod)
            return  # else kube-scheduler binds it: it comes back with its node
        state = self._pods.get(key)
        if state is None:
            self._start_pod(key, pod)
            return
        if state.finished:
            return
        seen = (pod.get("spec"), meta.get("labels"), meta.get("annotations"))
        if seen != state.seen:
            # An update (HandlePodUpdates), not the kubelet's own status write: queue a
            # resize the pod asks for (or one it no longer asks for), then retry the queue.
            state.seen = seen
            desired = _desired(pod)
            if (desired if desired != state.allocated else None) != state.desired:
                state.desired = desired if desired != state.allocated else None
                self._track(key, state)  # the scheduler's charge follows the spec
            if desired != state.allocated or _condition(pod, PENDING) is not None:
                self._deferred.add(key)
            self._retry_deferred("pod_updated")
            self._sync_observed_generation(key)
            pod = None  # written since it was read
        self._maybe_actuate(key, pod)

    def _sync_observed_generation(self, key: tuple[str, str]) -> None:
        """The kubelet reports the generation it synced (KEP-5067), resize or not."""
        pod = self.store.find("pods", *key)
        if pod is None:
            return
        generation = pod["metadata"].get("generation", 1)
        if (pod.get("status") or {}).get("observedGeneration") != generation:

            def observed(p: Obj) -> Obj:
                p["status"]["observedGeneration"] = generation
                return p

            self._write_status(key, observed)

    # --- scheduling and start -------------------------------------------------------------
    def _used(self, node: str, exclude: tuple[str, str] | None = None) -> Amounts:
        """Sum of allocated requests on `node` (kept incrementally: O(1) per question)."""
        used = dict(self._node_used.setdefault(node, {"cpu": 0, "memory": 0}))
        state = self._pods.get(exclude) if exclude is not None else None
        if state is not None and state.node == node:
            for k, v in state.total.items():
                used[k] -= v
        return used

    def _track(self, key: tuple[str, str], state: _PodState | None) -> None:
        """Record `key`'s new state (None: gone) in the per-node totals. Where the
        scheduler's charge on a node went down, pods waiting for room are tried again (as
        kube-scheduler requeues them on a pod's update or deletion)."""
        old = self._pods.pop(key, None)
        # what was tracked (`state` may be `old` itself, its totals about to be redone)
        was = (old.node, dict(old.charge), old.slots) if old is not None else None
        if old is not None:
            used = self._node_used.setdefault(old.node, {"cpu": 0, "memory": 0})
            charged = self._node_charged.setdefault(old.node, {"cpu": 0, "memory": 0})
            for k, v in old.total.items():
                used[k] -= v
            for k, v in old.charge.items():
                charged[k] -= v
            self._node_count[old.node] = self._node_count.get(old.node, 0) - old.slots
        if state is not None:
            # a finished pod is no longer active: it holds neither resources nor a pod slot
            state.total = (
                {"cpu": 0, "memory": 0}
                if state.finished
                else _pod_requests(state.allocated, state.init)
            )
            state.charge = _charged(state)
            state.slots = 0 if state.finished else 1
            self._pods[key] = state
            used = self._node_used.setdefault(state.node, {"cpu": 0, "memory": 0})
            charged = self._node_charged.setdefault(state.node, {"cpu": 0, "memory": 0})
            for k, v in state.total.items():
                used[k] += v
            for k, v in state.charge.items():
                charged[k] += v
            self._node_count[state.node] = self._node_count.get(state.node, 0) + state.slots
        freed = False
        if was is not None:
            node, charge, slots = was
            same = state is not None and state.node == node
            now_charge = state.charge if state is not None and same else {}
            now_slots = state.slots if state is not None and same else 0
            freed = now_slots < slots or any(now_charge.get(k, 0) < v for k, v in charge.items())
        if freed and self.schedules and self._unscheduled:
            self.call(self._schedule_pending)  # after what freed the room is written

    def _schedule(self, key: tuple[str, str], pod: Obj) -> None:
        desired, init = _desired(pod), _init_layout(pod)
        want = _pod_requests(desired, init)
        short = {"cpu": 0, "memory": 0}
        for node in self.nodes.values():
            used = self._node_charged.setdefault(node.name, {"cpu": 0, "memory": 0})
            count = self._node_count.get(node.name, 0)
            fits_cpu = used["cpu"] + want["cpu"] <= node.cpu
            fits_mem = used["memory"] + want["memory"] <= node.memory
            if fits_cpu and fits_mem and count < node.max_pods:
                self._unscheduled.discard(key)
                self._track(key, _PodState(node.name, desired, init))

                def bind(p: Obj, node_name: str = node.name) -> Obj:
                    p["spec"]["nodeName"] = node_name
                    _set_condition(p, "PodScheduled", "True")
                    return p

                self.store.update("pods", *key, bind)
                self._start_pod(key, self.store.get("pods", *key))
                return
            short["cpu"] += 0 if fits_cpu else 1
            short["memory"] += 0 if fits_mem else 1
        self._unscheduled.add(key)
        reasons = ", ".join(f"{n} Insufficient {k}" for k, n in short.items() if n)
        message = f"0/{len(self.nodes)} nodes are available: {reasons or 'Too many pods'}."

        def unschedulable(p: Obj) -> Obj:
            _set_condition(p, "PodScheduled", "False", "Unschedulable", message)
            return p

        self.store.update("pods", *key, unschedulable)

    def _schedule_pending(self) -> None:
        for key in sorted(self._unscheduled):
            pod = self.store.find("pods", *key)
            if pod is None or pod["spec"].get("nodeName"):
                self._unscheduled.discard(key)
                continue
            self._schedule(key, pod)

    def _start_pod(self, key: tuple[str, str], pod: Obj) -> None:
        node = self.nodes.get(pod["spec"]["nodeName"])
        if node is None:  # bound to a node no kubelet here runs (yet: it may be adopted)
            if self.adopts is not None:
                self._bound_elsewhere[key] = pod["spec"]["nodeName"]
            return
        self._bound_elsewhere.pop(key, None)
        if key not in self._pods:
            self._track(key, _PodState.of(node.name, pod))
        state = self._pods[key]
        if state.started:
            return
        state.started = True
        waits_for = runs_init_containers(self.runtime, pod)
        ip = self.runtime.start(pod) or self._pod_ip(node, next(self._ips))
        now = now_rfc3339()
        if waits_for:
            # Pending until its init containers have run to completion, one after the
            # other (`kubectl get pods`: Init:0/1); then it runs as below
            state.initializing = list(waits_for)
            self.store.update("pods", *key, _initializing(ip, now, waits_for))
            state.run_when_initialized = lambda: self._containers_started(key, node, ip, now)
            return
        self._containers_started(key, node, ip, now)

    def _containers_started(self, key: tuple[str, str], node: NodeSpec, ip: str, now: str) -> None:
        """The pod runs: its containers started (its init containers, if any, done)."""
        state = self._pods[key]

        def run(p: Obj) -> Obj:
            status = _started(p, "Running", ip, now)
            for ctype in (
                "PodReadyToStartContainers",
                "Initialized",
                "ContainersReady",
                "Ready",
                "PodScheduled",
            ):
                _set_condition(p, ctype, "True")

            def container_status(c: Obj) -> Obj:
                cs: Obj = {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": f"docker.io/library/{c.get('image', '')}@sha256:" + "0" * 64,
                    "containerID": "containerd://" + secrets.token_hex(32),
                    "ready": not self._probed(p, c["name"]),
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                    "lastState": {},
                }
                parts = state.allocated.get(c["name"])
                if parts is None:  # an init container that ran to completion
                    _set_terminated(cs, 0, "Completed", now, now)
                    return cs
                if parts["requests"]:
                    cs["allocatedResources"] = _rl_json(parts["requests"])
                if node.supports_resize:
                    cs["resources"] = _resources_json(parts)
                return cs

            init = p["spec"].get("initContainers") or []
            if init:
                # what ran to completion keeps its record (its exit, its restarts)
                before = {cs["name"]: cs for cs in status.get("initContainerStatuses") or []}
                status["initContainerStatuses"] = [
                    cs
                    if "terminated" in ((cs := before.get(c["name"]) or {}).get("state") or {})
                    and c["name"] not in state.allocated
                    else container_status(c)
                    for c in init
                ]
            status["containerStatuses"] = [
                container_status(c) for c in p["spec"].get("containers") or []
            ]
            unready = [cs["name"] for cs in status["containerStatuses"] if not cs["ready"]]
            if unready:  # until their readiness probes pass
                _not_ready(p, unready)
            return p

        self.store.update("pods", *key, run)
        pod = self.store.get("pods", *key)
        deadline = pod["spec"].get("activeDeadlineSeconds")
        if isinstance(deadline, int) and deadline > 0:
            uid = pod["metadata"]["uid"]
            self._after(deadline, lambda: self._deadline_exceeded(key, uid))
        self._retry_deferred("pods_added")

    def _deadline_exceeded(self, key: tuple[str, str], uid: str) -> None:
        """`activeDeadlineSeconds` ran out: the pod is killed and Failed. Its resources are
        free at once, but in 1.35 a pod's end is no retry trigger (docs/design/kubernetes-resize.md
        §2: only newer kubelets retry on `pod_terminated`): deferred resizes wait for the
        ticker."""
        state = self._pods.get(key)
        pod = self.store.find("pods", *key)
        if state is None or state.finished or pod is None or pod["metadata"]["uid"] != uid:
            return
        self._stop_runtime(pod)
        state.finished = True
        self._track(key, state)
        self._unqueue(key)
        now = now_rfc3339()

        def failed(p: Obj) -> Obj:
            status = p["status"]
            status["phase"] = "Failed"
            status["reason"] = "DeadlineExceeded"
            status["message"] = "Pod was active on the node longer than the specified deadline"
            for ctype in ("ContainersReady", "Ready"):
                _set_condition(p, ctype, "False", "PodFailed")
            for field_ in ("initContainerStatuses", "containerStatuses"):
                for cs in status.get(field_) or []:
                    running = (cs.get("state") or {}).get("running")
                    if running is not None:
                        _set_terminated(cs, 137, "Error", running.get("startedAt", now), now)
            return p

        self._write_status(key, failed)
        self._schedule_pending()  # the scheduler sees the room; the kubelet's retry does not

    # --- init containers ---------------------------------------------------------------------
    def _init_container_ended(self, key: tuple[str, str], uid: str, name: str, code: int) -> None:
        """A run-to-completion init container ended. Exit 0: the next one runs, and after
        the last the pod's containers start. Otherwise the runtime runs it again after a
        back-off (restartPolicy Always or OnFailure), or the pod has Failed (Never)."""
        state = self._pods.get(key)
        pod = self.store.find("pods", *key)
        if state is None or state.finished or pod is None or pod["metadata"]["uid"] != uid:
            return
        if name not in state.initializing:
            return
        now = now_rfc3339()
        never = (pod["spec"].get("restartPolicy") or "Always") == "Never"
        if code == 0:
            state.initializing.remove(name)
            if not state.initializing and state.run_when_initialized is not None:
                start, state.run_when_initialized = state.run_when_initialized, None
                start()
                return
            self._write_status(key, _init_progress(name, now, state.initializing))
            return
        log.info("pod %s/%s: init container %s exited %d", *key, name, code)
        self._write_status(key, _init_failed(name, code, now, failed_pod=never))
        if never:
            state.run_when_initialized = None
            self._stop_runtime(pod)
            state.finished = True
            self._track(key, state)
            self._unqueue(key)
            self._schedule_pending()
        else:
            state.restarts[name] = state.restarts.get(name, 0) + 1
            self._event(
                pod,
                "Warning",
                "BackOff",
                f"Back-off restarting failed container {name} in pod {key[1]}_{key[0]}({uid})",
            )

    # --- container exits (the pod's restartPolicy) ------------------------------------------
    def _container_exited(self, key: tuple[str, str], uid: str, name: str, code: int) -> None:
        """A container's process ended by itself: restart it (restartPolicy Always, or
        OnFailure and it failed; at once the first time, then with the crash-loop
        back-off), or report it terminated; a pod whose containers have all ended is
        Succeeded (every one exited 0) or Failed, and frees its resources."""
        state = self._pods.get(key)
        pod = self.store.find("pods", *key)
        if state is None or state.finished or pod is None or pod["metadata"]["uid"] != uid:
            return
        if pod["metadata"].get("deletionTimestamp"):
            return  # being deleted: the kubelet stops it anyway
        policy = pod["spec"].get("restartPolicy") or "Always"
        restart = policy == "Always" or (policy == "OnFailure" and code != 0)
        reason = "Completed" if code == 0 else "Error"
        count = state.restarts.get(name, 0)
        delay = 0.0 if count == 0 else min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2 ** (count - 1))
        now = now_rfc3339()
        log.info("pod %s/%s: container %s exited %d (%s)", *key, name, code, policy)

        def exited(p: Obj) -> Obj:
            status = p["status"]
            for cs in status.get("containerStatuses") or []:
                if cs["name"] != name:
                    continue
                running = (cs.get("state") or {}).get("running") or {}
                _set_terminated(cs, code, reason, running.get("startedAt", now), now)
                if restart:
                    cs["lastState"] = cs.pop("state")
                    cs["state"] = {
                        "waiting": {
                            "reason": "CrashLoopBackOff",
                            "message": f"back-off {delay:.0f}s restarting failed "
                            f"container={name} pod={key[1]}_{key[0]}({uid})",
                        }
                    }
            statuses = status.get("containerStatuses") or []
            ended = [cs for cs in statuses if "terminated" in (cs.get("state") or {})]
            if not restart and len(ended) == len(statuses):
                ok = all(cs["state"]["terminated"]["exitCode"] == 0 for cs in ended)
                status["phase"] = "Succeeded" if ok else "Failed"
                for ctype in ("ContainersReady", "Ready"):
                    _set_condition(p, ctype, "False", "PodCompleted" if ok else "PodFailed")
                return p
            _not_ready(p, [cs["name"] for cs in statuses if not cs.get("ready")])
            return p

        self._write_status(key, exited)
        if restart:
            if delay:
                self._event(
                    pod,
                    "Warning",
                    "BackOff",
                    f"Back-off restarting failed container {name} in pod {key[1]}_{key[0]}({uid})",
                )
            self._after(delay, lambda: self._restart_container(key, uid, name))
            return
        fresh = self.store.find("pods", *key)
        if fresh is not None and fresh["status"].get("phase") in ("Succeeded", "Failed"):
            self._stop_runtime(fresh)
            state.finished = True
            self._track(key, state)
            self._unqueue(key)
            self._schedule_pending()

    def _restart_container(self, key: tuple[str, str], uid: str, name: str) -> None:
        state = self._pods.get(key)
        pod = self.store.find("pods", *key)
        if state is None or state.finished or pod is None or pod["metadata"]["uid"] != uid:
            return
        if pod["metadata"].get("deletionTimestamp"):
            return
        state.restarts[name] = state.restarts.get(name, 0) + 1
        self.runtime.restart(pod, name)
        now = now_rfc3339()

        def started(p: Obj) -> Obj:
            statuses = p["status"].get("containerStatuses") or []
            for cs in statuses:
                if cs["name"] == name:
                    cs["restartCount"] = int(cs.get("restartCount", 0)) + 1
                    cs["containerID"] = "containerd://" + secrets.token_hex(32)
                    cs["state"] = {"running": {"startedAt": now}}
                    cs["started"] = True
                    cs["ready"] = not self._probed(p, name)
            if all(cs.get("ready") for cs in statuses):
                for ctype in ("ContainersReady", "Ready"):
                    _set_condition(p, ctype, "True")
            return p

        self._write_status(key, started)
        self._event(pod, "Normal", "Started", f"Started container {name}")

    def _probed(self, pod: Obj, container: str) -> bool:
        """The runtime runs this container's readiness probe: it starts unready."""
        probes = getattr(self.runtime, "probes_readiness", None)
        return bool(probes is not None and probes(pod, container))

    def _readiness(self, key: tuple[str, str], uid: str, name: str, ready: bool) -> None:
        """A readiness probe's verdict changed: the container's `ready`, and the pod's
        ContainersReady and Ready conditions with it."""
        state = self._pods.get(key)
        pod = self.store.find("pods", *key)
        if state is None or state.finished or pod is None or pod["metadata"]["uid"] != uid:
            return

        def change(p: Obj) -> Obj:
            statuses = p["status"].get("containerStatuses") or []
            for cs in statuses:
                if cs["name"] == name and "running" in (cs.get("state") or {}):
                    cs["ready"] = ready
            unready = [cs["name"] for cs in statuses if not cs.get("ready")]
            for ctype in ("ContainersReady", "Ready"):
                if unready:
                    _set_condition(
                        p,
                        ctype,
                        "False",
                        "ContainersNotReady",
                        f"containers with unready status: [{' '.join(unready)}]",
                    )
                else:
                    _set_condition(p, ctype, "True")
            return p

        self._write_status(key, change)
        if not ready:
            self._event(pod, "Warning", "Unhealthy", f"Readiness probe failed: container {name}")

    def _terminate(self, key: tuple[str, str], pod: Obj) -> None:
        self._forget(key, pod)
        if self.store.find("pods", *key) is not None:
            # the pod it ran, by UID: a pod of the same name made since is not its to delete
            # (409), as the kubelet's status manager deletes with a UID precondition
            with contextlib.suppress(ApiError):  # already gone: deleted twice is fine
                self.store.remove("pods", *key, uid=pod["metadata"].get("uid"))
        self._schedule_pending()
        self._retry_deferred("pods_removed")

    def _forget(self, key: tuple[str, str], pod: Obj) -> bool:
        """Stop the pod's containers (unless it finished already) and drop it from the
        kubelet's books and its resize queue. False if the kubelet did not run it."""
        state = self._pods.get(key)
        if state is not None and not state.finished:
            self._stop_runtime(pod)
        self._track(key, None)
        self._unqueue(key)
        self._to_actuate.discard(key)
        return state is not None

    def _unqueue(self, key: tuple[str, str]) -> None:
        """The pod's resize leaves the retry queue (it has ended, or the pod is gone)."""
        self._deferred.discard(key)
        self._pending_since.pop(key, None)

    def _stop_runtime(self, pod: Obj) -> None:
        try:
            self.runtime.stop_all([pod])
        except Exception as exc:
            log.exception("stopping pod %s", pod["metadata"]["name"])
            self.errors.append(repr(exc))

    # --- resize: allocation (handlePodResourcesResize) --------------------------------------
    def _handle_resize(self, key: tuple[str, str], pod: Obj, desired: ContainerAlloc) -> str:
        """Try to allocate the pod's desired resources (`_desired(pod)`): "" (nothing to
        do), "allocated", "Deferred" or "Infeasible"."""
        state = self._pods.get(key)
        if state is None or not state.started or state.finished:
            return ""
        node = self.nodes[state.node]
        generation = int(pod["metadata"].get("generation", 1))
        if desired == state.allocated:
            # Nothing (or nothing any more: reverted) to allocate. No event either way.
            self._pending_since.pop(key, None)
            state.pending_reported = None
            if _condition(pod, PENDING) is not None:

                def cleared(p: Obj) -> Obj:
                    _remove_condition(p, PENDING)
                    p["status"]["observedGeneration"] = generation
                    return p

                self._write_status(key, cleared)
            return ""
        if set(desired) != set(state.allocated):
            return ""  # the API server forbids this; nothing to allocate
        reason, message = "", ""
        early = False  # refusals before the admission check record no event (§2, step 2)
        if podlib.MIRROR_ANNOTATION in (pod["metadata"].get("annotations") or {}):
            reason, message = "Infeasible", "In-place resize of static-pods is not supported"
            early = True
        else:
            want = _pod_requests(desired, state.init)
            for res, cap in (("memory", node.memory), ("cpu", node.cpu)):
                if want[res] > cap:
                    reason = "Infeasible"
                    message = (
                        f"Node didn't have enough capacity: {res}, requested: {want[res]}, "
                        f"capacity: {cap}"
                    )
                    break
            if not reason:
                used = self._used(node.name, exclude=key)
                for res, cap in (("cpu", node.cpu), ("memory", node.memory)):
                    if used[res] + want[res] > cap:
                        reason = "Deferred"
                        message = (
                            f"Node didn't have enough resource: {res}, requested: {want[res]}, "
                            f"used: {used[res]}, capacity: {cap}"
                        )
                        break
        if state.infeasible != (reason == "Infeasible"):
            state.infeasible = reason == "Infeasible"
            self._track(key, state)
        if reason:
            previous = _condition(pod, PENDING)
            # a new pending resize (or a new reason) records an event; the kubelet knows
            # what it reported from its own status cache, not from what the API server
            # kept (1.33 drops the condition's observedGeneration)
            changed = previous is None or state.pending_reported != (reason, generation)
            if previous is None or key not in self._pending_since:
                self._pending_since[key] = time.monotonic()

            def pending(p: Obj) -> Obj:
                _set_condition(p, PENDING, "True", reason, message, generation)
                p["status"]["observedGeneration"] = generation
                return p

            self._write_status(key, pending)
            state.pending_reported = (reason, generation)
            if changed and not early:
                self._event(
                    pod,
                    "Warning",
                    f"Resize{reason}",
                    _resize_message(f"Pod resize {reason}", pod, generation, message),
                )
            return reason

        # Fits: checkpoint the allocation, then report it in one status write.
        self._pending_since.pop(key, None)
        state.pending_reported = None
        state.allocated = desired
        state.desired = None
        self._to_actuate.add(key)
        self._track(key, state)
        state.last_error = ""

        def accepted(p: Obj) -> Obj:
            _remove_condition(p, PENDING)
            _remove_condition(p, IN_PROGRESS)
            _set_condition(p, IN_PROGRESS, "True", "", "", generation)
            p["status"]["observedGeneration"] = generation
            for cs in _statuses(p):
                parts = desired.get(cs["name"])
                if parts is not None and parts["requests"]:
                    cs["allocatedResources"] = _rl_json(parts["requests"])
            return p

        state.actuate_at = time.monotonic() + self.timing.actuation_delay_s

        def start() -> None:
            self._write_status(key, accepted)
            self._event(
                pod,
                "Normal",
                "ResizeStarted",
                _resize_message("Pod resize started", pod, generation),
            )

        if self.timing.actuation_delay_s <= 0:
            # Nothing to wait for: like the kubelet's status manager, report acceptance
            # and actuation in one status write (docs/design/kubernetes-resize.md §2, step 3).
            with self._one_status_write(key):
                start()
                self._maybe_actuate(key)
        else:
            start()
            self._after(self.timing.actuation_delay_s, lambda: self._maybe_actuate(key))
        return "allocated"

    def _retry_deferred(self, trigger: str) -> None:
        """`RetryPendingResizes`: one pass over the queued resizes, in the kubelet's order:
        resizes that do not increase the pod's requests, then higher `spec.priority`, then
        Guaranteed before Burstable, then the longest pending. Deferred ones stay queued."""
        if self._in_retry:  # a resize finished inside a pass: retry after it, not within
            self.call(functools.partial(self._retry_deferred, trigger))
            return
        if not self._deferred:
            return
        # (order, pod, its desired resources); the order ends with the key, so it is unique
        candidates: list[tuple[tuple[bool, int, int, float, tuple[str, str]], Obj, ContainerAlloc]]
        candidates = []
        for key in list(self._deferred):
            pod = self.store.find("pods", *key)
            state = self._pods.get(key)
            if pod is None or state is None or state.finished:
                self._deferred.discard(key)
                continue
            desired = _desired(pod)
            want = _pod_requests(desired, state.init)
            grows = any(want[k] > state.total[k] for k in ("cpu", "memory"))
            order = (
                grows,
                -int((pod.get("spec") or {}).get("priority") or 0),
                0 if podlib.pod_qos(pod) == "Guaranteed" else 1,
                self._pending_since.get(key, float("inf")),
                key,
            )
            candidates.append((order, pod, desired))
        self._in_retry = True
        try:
            for order, pod, desired in sorted(candidates, key=lambda c: c[0]):
                key = order[-1]
                if self._handle_resize(key, pod, desired) != "Deferred":
                    self._deferred.discard(key)
        finally:
            self._in_retry = False
        log.debug("retried deferred resizes (%s): %d still deferred", trigger, len(self._deferred))

    def _retry_ticker(self) -> None:
        # re-armed whatever happens: through an API server a call can fail (a conflict, a
        # timeout), and a ticker that stopped would leave deferred resizes deferred for good
        try:
            self._retry_deferred("ticker")
        finally:
            self._after(self.timing.retry_interval_s, self._retry_ticker)

    def _sync_ticker(self) -> None:
        try:
            self._sync_pass()
        finally:
            self._after(self.timing.sync_interval_s, self._sync_ticker)

    # --- adopted nodes ------------------------------------------------------------------------
    def _on_node_event(self, kind: str, node: Obj) -> None:
        """A Node `adopts` accepts: run it from its first event (posting its status, and
        starting the pods already bound to it), follow its allocatable, let it go when it
        is deleted."""
        name = node["metadata"]["name"]
        if kind == "DELETED":
            if name in self._adopted:
                self._let_go(name)
            return
        if name in self.nodes and name not in self._adopted:
            return  # one of the kubelet's own
        spec = _adopted_spec(node)
        if self.nodes.get(name) == spec:
            return  # its own status post, or a change to its labels or taints
        known = name in self._adopted
        self.nodes[name] = spec
        self._adopted.add(name)
        self._node_index.setdefault(name, len(self._node_index))
        if known:
            return  # its allocatable changed: the new size counts from now on
        log.info("kubelet simulator: adopted node %s (%s)", name, _rl_json(_node_amounts(spec)))
        self._post_node_status(spec)
        for key, bound_to in sorted(self._bound_elsewhere.items()):
            if bound_to == name and (pod := self.store.find("pods", *key)) is not None:
                self._start_pod(key, pod)

    def _let_go(self, name: str) -> None:
        """An adopted Node was deleted (its machine is gone): what ran there stops, and
        the kubelet forgets the node (its pods' objects stay, as no kubelet reports them)."""
        for key, state in sorted(self._pods.items()):
            if state.node == name:
                if (pod := self.store.find("pods", *key)) is not None:
                    self._forget(key, pod)
                else:
                    self._track(key, None)
                    self._unqueue(key)
                    self._to_actuate.discard(key)
        del self.nodes[name]
        self._adopted.discard(name)
        log.info("kubelet simulator: node %s deleted, let go", name)

    def _node_status_ticker(self) -> None:
        try:
            for node in self.nodes.values():
                self._safely(functools.partial(self._post_node_status, node))
        finally:
            self._after(self.timing.node_status_interval_s, self._node_status_ticker)

    def _post_node_status(self, node: NodeSpec) -> None:
        """The node's status as this kubelet sees it (capacity, allocatable, Ready), with a
        new heartbeat; the Ready condition keeps its transition time while it stays True.
        An adopted node keeps the capacity and allocatable it was made with."""
        posted = _node_object(node)["status"]
        if node.name in self._adopted:
            del posted["capacity"], posted["allocatable"]
            posted["phase"] = "Running"

        def report(n: Obj) -> Obj:
            before = {c["type"]: c for c in (n.get("status") or {}).get("conditions") or []}
            for cond in posted["conditions"]:
                old = before.get(cond["type"])
                if old is not None and old.get("status") == cond["status"]:
                    cond["lastTransitionTime"] = old.get("lastTransitionTime")
            n["status"] = {**(n.get("status") or {}), **posted}
            return n

        try:
            self.store.update("nodes", "", node.name, report)
        except ApiError as err:
            if err.code != 404 or node.name not in self._adopted:
                raise  # an adopted node deleted: its DELETED event lets it go

    def _sync_pass(self) -> None:
        """The periodic pod sync's part here: actuation retried (a stalled or failed one),
        for the pods allocated a resize not yet actuated only."""
        for key in sorted(self._to_actuate):
            self._safely(functools.partial(self._maybe_actuate, key))

    # --- resize: actuation ------------------------------------------------------------------
    def _maybe_actuate(self, key: tuple[str, str], pod: Obj | None = None) -> None:
        """Actuate the pod's allocated resize if it is due (`pod`: as just read)."""
        state = self._pods.get(key)
        if state is None or state.finished:
            self._to_actuate.discard(key)
            return
        if key not in self._to_actuate:
            return  # nothing allocated since the last actuation
        if pod is None:
            pod = self.store.find("pods", *key)
        if pod is None or not state.started:
            return
        if state.actuate_at is not None and time.monotonic() < state.actuate_at:
            return
        actual = _actual(pod, state.allocated)
        node = self.nodes[state.node]
        if not node.supports_resize or actual is None:
            return
        if node.stalls_actuation and actual != state.allocated:
            return
        if actual == state.allocated:
            if _condition(pod, IN_PROGRESS) is not None:
                self._write_status(key, lambda p: _remove_condition(p, IN_PROGRESS))
            self._to_actuate.discard(key)
            return
        generation = int(pod["metadata"].get("generation", 1))
        failures = []
        usage = _memory_usage(pod)
        for c in _resizable(pod):
            name = c["name"]
            new_limit = state.allocated[name]["limits"].get("memory")
            old_limit = (actual.get(name) or {}).get("limits", {}).get("memory")
            policy = _policy(c, "memory")
            if new_limit is None or policy == "RestartContainer":
                continue
            if old_limit is not None and new_limit >= old_limit:
                continue
            used = usage.get(name, usage.get("*"))
            if used is not None and used >= new_limit:
                failures.append(
                    f'attempting to set container "{name}" memory limit ({new_limit}) '
                    f"below current usage ({used})"
                )
        if failures:
            detail = failures[0] if len(failures) == 1 else "[" + ", ".join(failures) + "]"
            message = f"cannot decrease memory limits: {detail}"

            def error(p: Obj) -> Obj:
                cond = _condition(p, IN_PROGRESS)
                since = cond.get("lastTransitionTime") if cond else None
                _set_condition(
                    p,
                    IN_PROGRESS,
                    "True",
                    "Error",
                    message,
                    cond.get("observedGeneration", generation) if cond else generation,
                )
                if since:
                    cond2 = _condition(p, IN_PROGRESS)
                    assert cond2 is not None
                    cond2["lastTransitionTime"] = since
                return p

            self._write_status(key, error)
            if state.last_error != message:
                state.last_error = message
                self._event(
                    pod,
                    "Warning",
                    "ResizeError",
                    _resize_message("Pod resize error", pod, generation, message),
                )
            return
        state.last_error = ""
        allocated = state.allocated
        restarted = {
            c["name"]
            for c in _resizable(pod)
            for res in ("cpu", "memory")
            if _policy(c, res) == "RestartContainer"
            and (actual.get(c["name"]) or {}) != allocated[c["name"]]
            and _changed(actual.get(c["name"]), allocated[c["name"]], res)
        }

        def done(p: Obj) -> Obj:
            for cs in _statuses(p):
                parts = allocated.get(cs["name"])
                if parts is not None:
                    cs["resources"] = _resources_json(parts)
                    if cs["name"] in restarted:
                        cs["restartCount"] = int(cs.get("restartCount", 0)) + 1
            _remove_condition(p, IN_PROGRESS)
            return p

        self._write_status(key, done)
        self._to_actuate.discard(key)
        self._event(
            pod,
            "Normal",
            "ResizeCompleted",
            _resize_message("Pod resize completed", pod, generation),
        )
        self._schedule_pending()
        self._retry_deferred("pod_resized")

    # --- writes -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _one_status_write(self, key: tuple[str, str]) -> Iterator[None]:
        """Collect the status changes made inside, and write them to the pod at once."""
        changes: list[Callable[[Obj], Obj | None]] = []
        previous, self._batch = self._batch, (key, changes)
        try:
            yield
        finally:
            self._batch = previous
            if changes:

                def all_of(p: Obj) -> Obj:
                    for change in changes:
                        out = change(p)
                        p = p if out is None else out
                    return p

                self._write_status(key, all_of)

    def _write_status(self, key: tuple[str, str], change: Callable[[Obj], Obj | None]) -> None:
        if self._batch is not None and self._batch[0] == key:
            self._batch[1].append(change)
            return

        def mutate(p: Obj) -> Obj:
            p.setdefault("status", {})
            out = change(p)
            return p if out is None else out

        try:
            self.store.update("pods", *key, mutate)
        except Exception as exc:  # the pod went away meanwhile
            log.debug("status write for %s skipped: %s", key, exc)

    def _event(self, pod: Obj, type_: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        node = pod["spec"].get("nodeName", "")
        record_event(
            self.store,
            involved={
                "kind": "Pod",
                "namespace": meta.get("namespace", ""),
                "name": meta["name"],
                "uid": meta["uid"],
                "apiVersion": "v1",
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            type_=type_,
            reason=reason,
            message=message,
            component="kubelet",
            host=node,
        )


def record_event(
    store: PodStore,
    involved: Obj,
    type_: str,
    reason: str,
    message: str,
    component: str,
    host: str = "",
) -> Obj:
    now = now_rfc3339()
    source: Obj = {"component": component}
    if host:
        source["host"] = host
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        # client-go's recorder names events `<object>.<UnixNano in hex>`.
        "metadata": {"name": f"{involved['name']}.{_event_clock():x}"},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "source": source,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "type": type_,
        "eventTime": None,
        "reportingComponent": component,
        "reportingInstance": host,
    }
    return store.create("events", involved.get("namespace", ""), event)


_last_event_ns = 0
_event_lock = threading.Lock()


def _event_clock() -> int:
    """Strictly increasing nanoseconds, so two events never share a name."""
    global _last_event_ns
    with _event_lock:
        _last_event_ns = max(time.time_ns(), _last_event_ns + 1)
        return _last_event_ns


def _resize_message(prefix: str, pod: Obj, generation: int, error: str = "") -> str:
    """pkg/kubelet/events/resize.go: `<prefix>: <json>` with the desired container resources."""
    body: dict[str, Any] = {}
    init = [
        {"name": c["name"], "resources": _sorted_resources(c.get("resources") or {})}
        for c in (pod["spec"].get("initContainers") or [])
        if podlib.is_sidecar(c)
    ]
    if init:
        body["initContainers"] = init
    body["containers"] = [
        {"name": c["name"], "resources": _sorted_resources(c.get("resources") or {})}
        for c in pod["spec"].get("containers") or []
    ]
    body["generation"] = generation
    if error:
        body["error"] = error
    return f"{prefix}: {json.dumps(body, separators=(',', ':'))}"


def _sorted_resources(res: Obj) -> Obj:
    out: Obj = {}
    for part in ("limits", "requests"):
        if res.get(part):
            out[part] = dict(sorted(res[part].items()))
    return out


def _statuses(pod: Obj) -> list[Obj]:
    """The pod's container statuses, init containers' first (the dicts themselves)."""
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def _waiting(c: Obj, reason: str) -> Obj:
    return {
        "name": c["name"],
        "image": c.get("image", ""),
        "imageID": "",
        "ready": False,
        "started": False,
        "restartCount": 0,
        "state": {"waiting": {"reason": reason}},
        "lastState": {},
    }


def _started(p: Obj, phase: str, ip: str, now: str) -> Obj:
    """The status of a pod the kubelet has started (its sandbox up, its IP given)."""
    status: Obj = p.setdefault("status", {})
    status["phase"] = phase
    status["hostIP"] = "127.0.0.1"
    status["hostIPs"] = [{"ip": "127.0.0.1"}]
    status["podIP"] = ip
    status["podIPs"] = [{"ip": ip}]
    status["startTime"] = now
    status["observedGeneration"] = p["metadata"].get("generation", 1)
    return status


def _initializing(ip: str, now: str, waits_for: list[str]) -> Callable[[Obj], Obj]:
    """A pod whose first init container runs: Pending, not Initialized (1.35's wording)."""

    def change(p: Obj) -> Obj:
        status = _started(p, "Pending", ip, now)
        spec = p["spec"]
        _set_condition(p, "PodReadyToStartContainers", "True")
        _set_condition(
            p,
            "Initialized",
            "False",
            "ContainersNotInitialized",
            f"containers with incomplete status: [{' '.join(waits_for)}]",
        )
        names = [c["name"] for c in spec.get("containers") or []]
        for ctype in ("Ready", "ContainersReady"):
            _set_condition(
                p,
                ctype,
                "False",
                "ContainersNotReady",
                f"containers with unready status: [{' '.join(names)}]",
            )
        statuses = []
        for c in spec.get("initContainers") or []:
            cs = _waiting(c, "PodInitializing")
            if c["name"] == waits_for[0]:
                cs["state"] = {"running": {"startedAt": now}}
                cs["started"] = True
            elif c["name"] not in waits_for:  # a sidecar, or one with nothing to run
                cs["state"] = {"running": {"startedAt": now}}
                cs["started"] = cs["ready"] = bool(podlib.is_sidecar(c))
                if not podlib.is_sidecar(c):
                    _set_terminated(cs, 0, "Completed", now, now)
            statuses.append(cs)
        status["initContainerStatuses"] = statuses
        status["containerStatuses"] = [
            _waiting(c, "PodInitializing") for c in spec.get("containers") or []
        ]
        return p

    return change


def _init_progress(done: str, now: str, left: list[str]) -> Callable[[Obj], Obj]:
    """An init container completed; the next one runs."""

    def change(p: Obj) -> Obj:
        for cs in p["status"].get("initContainerStatuses") or []:
            if cs["name"] == done:
                started = ((cs.get("state") or {}).get("running") or {}).get("startedAt", now)
                _set_terminated(cs, 0, "Completed", started, now)
            elif cs["name"] == left[0]:
                cs["state"] = {"running": {"startedAt": now}}
                cs["started"] = True
        _set_condition(
            p,
            "Initialized",
            "False",
            "ContainersNotInitialized",
            f"containers with incomplete status: [{' '.join(left)}]",
        )
        return p

    return change


def _init_failed(name: str, code: int, now: str, *, failed_pod: bool) -> Callable[[Obj], Obj]:
    """An init container failed: the pod Failed (restartPolicy Never), or the container
    waits to run again (Init:CrashLoopBackOff)."""

    def change(p: Obj) -> Obj:
        status = p["status"]
        for cs in status.get("initContainerStatuses") or []:
            if cs["name"] != name:
                continue
            started = ((cs.get("state") or {}).get("running") or {}).get("startedAt", now)
            _set_terminated(cs, code, "Error", started, now)
            if not failed_pod:
                cs["lastState"] = cs.pop("state")
                cs["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
                cs["restartCount"] = int(cs.get("restartCount", 0)) + 1
        if failed_pod:
            status["phase"] = "Failed"
        return p

    return change


def _set_terminated(cs: Obj, exit_code: int, reason: str, started_at: str, now: str) -> None:
    """Report a container status's container as terminated (neither ready nor started)."""
    cs["ready"] = False
    cs["started"] = False
    cs["state"] = {
        "terminated": {
            "exitCode": exit_code,
            "reason": reason,
            "startedAt": started_at,
            "finishedAt": now,
            "containerID": cs.get("containerID", ""),
        }
    }


def _actual(pod: Obj, names: ContainerAlloc) -> ContainerAlloc | None:
    """What the runtime applied to the containers in `names` (None: not reported, the node
    does not support resize)."""
    out: ContainerAlloc = {}
    for cs in _statuses(pod):
        if cs["name"] not in names:
            continue
        res = cs.get("resources")
        if res is None:
            return None
        out[cs["name"]] = {
            "requests": _amounts(res.get("requests")),
            "limits": _amounts(res.get("limits")),
        }
    return out


def _changed(actual: dict[str, Amounts] | None, alloc: dict[str, Amounts], res: str) -> bool:
    a = actual or {"requests": {}, "limits": {}}
    return any(a.get(p, {}).get(res) != alloc[p].get(res) for p in ("requests", "limits"))


def _policy(container: Obj, resource: str) -> str:
    for p in container.get("resizePolicy") or []:
        if p.get("resourceName") == resource:
            return str(p.get("restartPolicy", "NotRequired"))
    return "NotRequired"


def _memory_usage(pod: Obj) -> dict[str, int]:
    text = (pod["metadata"].get("annotations") or {}).get(MEMORY_USAGE_ANNOTATION)
    if not text:
        return {}
    out: dict[str, int] = {}
    try:
        for part in text.split(","):
            if "=" in part:
                name, value = part.split("=", 1)
                out[name.strip()] = quantity_to_units(value.strip(), MEMORY)
            else:
                out["*"] = quantity_to_units(part.strip(), MEMORY)
    except ValueError:
        log.warning("ignoring malformed %s annotation %r", MEMORY_USAGE_ANNOTATION, text)
        return {}
    return out


def _condition(pod: Obj, ctype: str) -> Obj | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return None


def _not_ready(pod: Obj, unready: list[str]) -> None:
    """ContainersReady and Ready False, naming the containers, as the kubelet says it."""
    for ctype in ("ContainersReady", "Ready"):
        _set_condition(
            pod,
            ctype,
            "False",
            "ContainersNotReady",
            f"containers with unready status: [{' '.join(unready)}]",
        )


def _remove_condition(pod: Obj, ctype: str) -> Obj:
    status = pod.setdefault("status", {})
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != ctype]
    status["conditions"] = conditions
    return pod


def _set_condition(
    pod: Obj,
    ctype: str,
    status_value: str,
    reason: str = "",
    message: str = "",
    observed_generation: int | None = None,
) -> None:
    status = pod.setdefault("status", {})
    conditions = status.setdefault("conditions", [])
    existing = next((c for c in conditions if c.get("type") == ctype), None)
    cond: Obj = {"type": ctype, "status": status_value}
    if observed_generation is not None:
        cond["observedGeneration"] = observed_generation
    cond["lastProbeTime"] = None
    keep_time = existing is not None and existing.get("status") == status_value
    cond["lastTransitionTime"] = (
        existing["lastTransitionTime"] if keep_time and existing else now_rfc3339()
    )
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    if existing is not None:
        conditions[conditions.index(existing)] = cond
    else:
        conditions.append(cond)


def _adopted_spec(node: Obj) -> NodeSpec:
    """How the kubelet sizes a Node it adopts: by the allocatable it was made with."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return NodeSpec(
        node["metadata"]["name"],
        cpu=quantity_to_units(str(allocatable.get("cpu", "0")), CPU),
        memory=quantity_to_units(str(allocatable.get("memory", "0")), MEMORY),
        max_pods=int(str(allocatable.get("pods", "110"))),
    )


def _node_amounts(node: NodeSpec) -> Amounts:
    return {"cpu": node.cpu, "memory": node.memory}


def _node_object(node: NodeSpec) -> Obj:
    cpu = canonical(f"{node.cpu}m")
    memory = canonical(f"{node.memory // 1024}Ki") if node.memory % 1024 == 0 else str(node.memory)
    resources = {"cpu": cpu, "memory": memory, "pods": str(node.max_pods)}
    now = now_rfc3339()
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": {
                "kubernetes.io/hostname": node.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": node.name},
            ],
            "nodeInfo": {
                "kubeletVersion": KUBELET_VERSION,
                "operatingSystem": "linux",
                "architecture": "amd64",
                "containerRuntimeVersion": "containerd://2.1.0",
                "osImage": "raysize sandbox",
                "kernelVersion": "",
                "kubeProxyVersion": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        },
    }
