"""Black-box conformance: docs/design/kubernetes-resize.md §2 (what the kubelet reports), one test per rule.

Everything goes through the real `kubernetes` client. The first part uses only the
`kube`/`core`/`ns` fixtures, so with RAYSIZE_TEST_KUBECONFIG pointing at a real v1.35
cluster it runs unchanged against it: node room is made through the API, by pinning pods
to one node (`spec.nodeName`) and filling what is left of it. The last part ("needs the
sandbox") relies on a sandbox knob (an actuation delay long enough to look at a resize in
progress, no retry ticker) and builds its own sandbox.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from raysize.sandbox.kubelet import KubeletTiming
from raysize.workflows.resources import CPU, MEMORY, quantity_to_units
from tests.sandbox.conftest import PAUSE_IMAGE, client_for, wait_for

PENDING = "PodResizePending"
IN_PROGRESS = "PodResizeInProgress"
GI = 1024**3
# A real kubelet retries deferred resizes 30 s after it starts, then every 3 min.
TICKER_WAIT_S = 240


# --- helpers --------------------------------------------------------------------------------
def millis(quantity: str) -> int:
    return quantity_to_units(quantity, CPU)


def container(name: str, cpu: str, *, guaranteed: bool = False, **extra: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": "64Mi"}}
    if guaranteed:
        resources["limits"] = {"cpu": cpu, "memory": "64Mi"}
    return {"name": name, "image": PAUSE_IMAGE, "resources": resources, **extra}


def pod(
    name: str,
    cpu: str,
    *,
    node: str | None = None,
    guaranteed: bool = False,
    init: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "conformance-kubelet"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [container("c0", cpu, guaranteed=guaranteed)],
            **spec,
        },
    }
    if node is not None:
        body["spec"]["nodeName"] = node  # pinned: the node's own admission decides
    if init:
        body["spec"]["initContainers"] = init
    return body


def start(core: client.CoreV1Api, ns: str, body: dict[str, Any]) -> client.V1Pod:
    name = body["metadata"]["name"]
    core.create_namespaced_pod(ns, body)
    return wait_for(
        lambda: (p := core.read_namespaced_pod(name, ns)).status.phase == "Running" and p,
        timeout=60,
    )


def resize_cpu(
    core: client.CoreV1Api,
    ns: str,
    name: str,
    cpu: str,
    *,
    guaranteed: bool = False,
    container_name: str = "c0",
    field: str = "containers",
) -> client.V1Pod:
    resources: dict[str, Any] = {"requests": {"cpu": cpu}}
    if guaranteed:
        resources["limits"] = {"cpu": cpu}
    body = {"spec": {field: [{"name": container_name, "resources": resources}]}}
    return core.patch_namespaced_pod_resize(name, ns, body)


def conditions(p: client.V1Pod) -> dict[str, client.V1PodCondition]:
    return {c.type: c for c in p.status.conditions or []}


def condition(core: client.CoreV1Api, ns: str, name: str, ctype: str) -> Any:
    return conditions(core.read_namespaced_pod(name, ns)).get(ctype)


def deferred(core: client.CoreV1Api, ns: str, name: str) -> Any:
    c = condition(core, ns, name, PENDING)
    return c if c is not None and c.reason == "Deferred" else None


def status_of(p: client.V1Pod, name: str = "c0") -> client.V1ContainerStatus:
    statuses = [*(p.status.init_container_statuses or []), *(p.status.container_statuses or [])]
    return next(s for s in statuses if s.name == name)


def actual_cpu(core: client.CoreV1Api, ns: str, name: str, c: str = "c0") -> str:
    return str(status_of(core.read_namespaced_pod(name, ns), c).resources.requests["cpu"])


def resize_done(core: client.CoreV1Api, ns: str, name: str, cpu: str, c: str = "c0") -> bool:
    p = core.read_namespaced_pod(name, ns)
    return millis(status_of(p, c).resources.requests["cpu"]) == millis(cpu) and not {
        PENDING,
        IN_PROGRESS,
    } & set(conditions(p))


def completed_reasons(core: client.CoreV1Api, ns: str, name: str) -> list[str]:
    """The pod's event reasons once the last is ResizeCompleted: the kubelet posts that
    Event just after the status write that ends the resize, so a test that saw the status
    waits for it."""
    wait_for(lambda: reasons(core, ns, name)[-1:] == ["ResizeCompleted"])
    return reasons(core, ns, name)


def events(core: client.CoreV1Api, ns: str, name: str) -> list[client.CoreV1Event]:
    """The kubelet's events of the pod, oldest first (client-go names them `<pod>.<UnixNano
    in hex>`); not the scheduler's `Scheduled` (the real world's, where kube-scheduler binds
    the pod)."""
    items = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    mine = [e for e in items if e.source is not None and e.source.component == "kubelet"]
    return sorted(mine, key=lambda e: e.metadata.name)


def reasons(core: client.CoreV1Api, ns: str, name: str) -> list[str]:
    return [e.reason for e in events(core, ns, name)]


def event_json(event: client.CoreV1Event) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(event.message.split(": ", 1)[1])
    return body


def pod_cpu_request(p: client.V1Pod) -> int:
    """resourcehelper.PodRequests for cpu: containers + sidecars, or an init container
    next to the sidecars before it if that is more."""

    def req(c: client.V1Container) -> int:
        return millis((c.resources.requests or {}).get("cpu", "0")) if c.resources else 0

    total = sum(req(c) for c in p.spec.containers)
    sidecars = 0
    for c in p.spec.init_containers or []:
        if c.restart_policy == "Always":
            sidecars += req(c)
            total += req(c)
        else:
            total = max(total, req(c) + sidecars)
    return total


def cpu_used(core: client.CoreV1Api, node: str) -> int:
    """What the node's active pods request, summed (the kubelet's `used`)."""
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    return sum(pod_cpu_request(p) for p in pods if p.status.phase not in ("Succeeded", "Failed"))


class Node:
    """One node, with its allocatable cpu, that a test fills through the API."""

    def __init__(self, core: client.CoreV1Api) -> None:
        nodes = [
            n
            for n in core.list_node().items
            if not n.spec.taints
            and not n.spec.unschedulable
            and n.status.allocatable
            # a kubelet reports it Ready (not the conformance suite's parked node)
            and any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
        ]
        assert nodes, "no schedulable node"
        self.core = core
        best = max(
            nodes,
            key=lambda n: millis(n.status.allocatable["cpu"]) - cpu_used(core, n.metadata.name),
        )
        self.name: str = best.metadata.name
        self.capacity = millis(best.status.allocatable["cpu"])

    def used(self) -> int:
        return cpu_used(self.core, self.name)

    def fill(self, ns: str, leave: int = 0, name: str = "filler", **spec: Any) -> client.V1Pod:
        """A pinned pod that takes all the node's free cpu but `leave` millicores."""
        free = self.capacity - self.used()
        assert free - leave > 0, f"node {self.name} has only {free}m free"
        return start(self.core, ns, pod(name, f"{free - leave}m", node=self.name, **spec))

    def deferred_message(self, requested: int, used: int) -> str:
        return (
            f"Node didn't have enough resource: cpu, requested: {requested}, used: {used}, "
            f"capacity: {self.capacity}"
        )


@pytest.fixture
def node(core: client.CoreV1Api) -> Node:
    return Node(core)


def wait_past_second(stamp: Any) -> None:
    """Wait until the wall clock is past the second of a condition's timestamp, so that a
    timestamp written now would differ from it (the API keeps whole seconds)."""
    while time.time() < stamp.timestamp() + 1.05:
        time.sleep(0.05)


def watch_pod(
    core: client.CoreV1Api,
    ns: str,
    name: str,
    resource_version: str,
    until: Callable[[client.V1Pod], bool],
    timeout: int = 60,
) -> list[client.V1Pod]:
    """Every state of the pod written after `resource_version`, up to the first for which
    `until` holds."""
    seen: list[client.V1Pod] = []
    w = watch.Watch()
    for event in w.stream(
        core.list_namespaced_pod,
        ns,
        field_selector=f"metadata.name={name}",
        resource_version=resource_version,
        timeout_seconds=timeout,
    ):
        seen.append(event["object"])
        if until(event["object"]):
            w.stop()
            return seen
    raise AssertionError(f"pod {name} never got there; states seen: {len(seen)}")


@pytest.fixture
def priority(kube: client.ApiClient) -> Iterator[Callable[[dict[str, Any], int], None]]:
    """Give a pod body a priority: through a PriorityClass where the API serves them (a real
    cluster's Priority admission refuses a bare `spec.priority`), else `spec.priority`."""
    scheduling = client.SchedulingV1Api(kube)
    made: list[str] = []

    def give(body: dict[str, Any], value: int) -> None:
        name = f"raysize-conformance-{uuid.uuid4().hex[:8]}"
        try:
            scheduling.create_priority_class({"metadata": {"name": name}, "value": value})
        except ApiException as exc:
            if exc.status != 404:
                raise
            body["spec"]["priority"] = value  # the sandbox has no PriorityClass kind
            return
        made.append(name)
        body["spec"]["priorityClassName"] = name

    yield give
    for name in made:
        scheduling.delete_priority_class(name)


# --- Deferred -------------------------------------------------------------------------------
def test_deferred_resize_has_the_kubelets_message_and_completes_when_another_pod_shrinks(
    core, ns, node, tracked
):
    start(core, ns, pod("p", "500m", node=node.name))
    filler = node.fill(ns)
    used = node.used() - 500  # by the other pods
    patched = resize_cpu(core, ns, "p", "1500m")
    cond = wait_for(lambda: deferred(core, ns, "p"), timeout=30)
    assert (cond.status, cond.message) == ("True", node.deferred_message(1500, used))
    assert cond.observed_generation == tracked(patched.metadata.generation)
    event = wait_for(lambda: events(core, ns, "p"))[0]
    assert (event.type, event.reason) == ("Warning", "ResizeDeferred")
    assert event.message.startswith("Pod resize Deferred: {")
    assert event_json(event) == {
        "containers": [
            {"name": "c0", "resources": {"requests": {"cpu": "1500m", "memory": "64Mi"}}}
        ],
        "generation": patched.metadata.generation,
        "error": cond.message,
    }
    assert actual_cpu(core, ns, "p") == "500m"

    free_m = millis(filler.spec.containers[0].resources.requests["cpu"]) - 1000
    resize_cpu(core, ns, "filler", f"{free_m}m")  # a shrink: makes room for p
    wait_for(lambda: resize_done(core, ns, "p", "1500m"), timeout=60)
    assert completed_reasons(core, ns, "p") == [
        "ResizeDeferred",
        "ResizeStarted",
        "ResizeCompleted",
    ]


def test_deferred_resize_completes_when_another_pod_is_deleted(core, ns, node):
    start(core, ns, pod("p", "500m", node=node.name))
    node.fill(ns)
    resize_cpu(core, ns, "p", "1500m")
    wait_for(lambda: deferred(core, ns, "p"), timeout=30)
    core.delete_namespaced_pod("filler", ns, grace_period_seconds=0)
    wait_for(lambda: resize_done(core, ns, "p", "1500m"), timeout=60)
    assert completed_reasons(core, ns, "p") == [
        "ResizeDeferred",
        "ResizeStarted",
        "ResizeCompleted",
    ]


# --- accepted: allocated first, actuated later ------------------------------------------------
def test_accepted_resize_is_allocated_in_progress_with_old_resources_until_actuated(
    core, ns, tracked, keeps_allocated
):
    before = start(core, ns, pod("p", "100m", guaranteed=True))
    patched = resize_cpu(core, ns, "p", "200m", guaranteed=True)
    gen = patched.metadata.generation
    assert gen == before.metadata.generation + 1

    def finished(p: client.V1Pod) -> bool:
        cs = status_of(p)
        return cs.resources.limits["cpu"] == "200m" and IN_PROGRESS not in conditions(p)

    states = watch_pod(core, ns, "p", patched.metadata.resource_version, finished)
    in_progress = [s for s in states if IN_PROGRESS in conditions(s)]
    assert in_progress, "the resize was never reported in progress"
    first = in_progress[0]
    cond = conditions(first)[IN_PROGRESS]
    assert (cond.status, cond.reason, cond.message) == ("True", None, None)
    assert cond.observed_generation == tracked(gen)
    assert first.status.observed_generation == tracked(gen)
    assert PENDING not in conditions(first)
    for s in in_progress:  # allocated at once, applied only after actuation
        cs = status_of(s)
        if keeps_allocated:
            assert cs.allocated_resources["cpu"] == "200m"
        assert (cs.resources.requests["cpu"], cs.resources.limits["cpu"]) == ("100m", "100m")
    done = states[-1]
    assert status_of(done).resources.requests["cpu"] == "200m"
    if keeps_allocated:
        assert status_of(done).allocated_resources["cpu"] == "200m"
    assert PENDING not in conditions(done)

    started, completed = wait_for(lambda: len(events(core, ns, "p")) >= 2 and events(core, ns, "p"))
    assert [(e.type, e.reason) for e in (started, completed)] == [
        ("Normal", "ResizeStarted"),
        ("Normal", "ResizeCompleted"),
    ]
    assert started.message.startswith("Pod resize started: {")
    assert completed.message.startswith("Pod resize completed: {")
    assert (
        event_json(started)
        == event_json(completed)
        == {
            "containers": [
                {
                    "name": "c0",
                    "resources": {
                        "limits": {"cpu": "200m", "memory": "64Mi"},
                        "requests": {"cpu": "200m", "memory": "64Mi"},
                    },
                }
            ],
            "generation": gen,
        }
    )


# --- Infeasible ----------------------------------------------------------------------------
def test_infeasible_resize_names_memory_first_when_both_exceed_the_node(
    core, ns, node, server_minor, tracked
):
    """1.33-1.35: the kubelet marks it Infeasible, naming memory first. 1.36's admission
    refuses it before the kubelet sees it, naming both, cpu first."""
    p = start(core, ns, pod("p", "100m", node=node.name))
    memory = quantity_to_units(core.read_node(node.name).status.allocatable["memory"], MEMORY)
    want_cpu, want_memory = node.capacity + 1000, memory + GI
    body = {
        "spec": {
            "containers": [
                {
                    "name": "c0",
                    "resources": {"requests": {"cpu": f"{want_cpu}m", "memory": str(want_memory)}},
                }
            ]
        }
    }
    if server_minor >= 36:
        with pytest.raises(ApiException) as refused:
            core.patch_namespaced_pod_resize("p", ns, body)
        assert refused.value.status == 403
        assert json.loads(refused.value.body)["message"] == (
            'pods "p" is forbidden: node didn\'t have enough allocatable resources: cpu, '
            f"requested: {want_cpu}, allocatable: {node.capacity}; memory, requested: "
            f"{want_memory}, allocatable: {memory}"
        )
        return
    patched = core.patch_namespaced_pod_resize("p", ns, body)
    cond = wait_for(lambda: condition(core, ns, "p", PENDING), timeout=30)
    assert (cond.status, cond.reason, cond.observed_generation) == (
        "True",
        "Infeasible",
        tracked(patched.metadata.generation),
    )
    assert cond.message == (
        f"Node didn't have enough capacity: memory, requested: {want_memory}, capacity: {memory}"
    )
    event = wait_for(lambda: events(core, ns, "p"))[0]
    assert (event.type, event.reason) == ("Warning", "ResizeInfeasible")
    assert event.message.startswith("Pod resize Infeasible: {")
    assert event_json(event)["error"] == cond.message
    assert status_of(core.read_namespaced_pod("p", ns)).allocated_resources == (
        status_of(p).allocated_resources
    )


# --- Pending: reverted, updated -------------------------------------------------------------
@pytest.mark.parametrize("reason", ["Deferred", "Infeasible"])
def test_pending_resize_reverted_clears_the_condition_without_an_event(
    core, ns, node, reason, server_minor, tracked, keeps_allocated
):
    start(core, ns, pod("p", "500m", node=node.name))
    if reason == "Deferred":
        node.fill(ns)
        target = "1500m"
    else:
        target = f"{node.capacity + 1000}m"
    if reason == "Infeasible" and server_minor >= 36:
        # 1.36's admission refuses it: no pending resize, nothing to revert
        with pytest.raises(ApiException) as refused:
            resize_cpu(core, ns, "p", target)
        assert refused.value.status == 403
        p = core.read_namespaced_pod("p", ns)
        assert PENDING not in conditions(p) and reasons(core, ns, "p") == []
        return
    resize_cpu(core, ns, "p", target)
    wait_for(lambda: (c := condition(core, ns, "p", PENDING)) and c.reason == reason, timeout=30)
    wait_for(lambda: reasons(core, ns, "p") == [f"Resize{reason}"])
    reverted = resize_cpu(core, ns, "p", "500m")

    def cleared() -> client.V1Pod | None:
        p = core.read_namespaced_pod("p", ns)
        return None if PENDING in conditions(p) else p

    p = wait_for(cleared, timeout=30)
    assert p.status.observed_generation == tracked(reverted.metadata.generation)
    assert IN_PROGRESS not in conditions(p)
    if keeps_allocated:
        assert status_of(p).allocated_resources["cpu"] == "500m"
    assert reasons(core, ns, "p") == [f"Resize{reason}"]


def test_a_changed_deferred_message_alone_records_no_event_and_keeps_the_transition_time(
    core, ns, node, tracked
):
    start(core, ns, pod("p", "500m", node=node.name))
    start(core, ns, pod("small", "200m", node=node.name))
    node.fill(ns)
    used = node.used() - 500  # by the other pods
    patched = resize_cpu(core, ns, "p", "1500m")
    first = wait_for(lambda: deferred(core, ns, "p"), timeout=30)
    assert first.message == node.deferred_message(1500, used)
    wait_past_second(first.last_transition_time)
    core.delete_namespaced_pod("small", ns, grace_period_seconds=0)  # still not enough room
    later = wait_for(
        lambda: (c := deferred(core, ns, "p")) and c.message != first.message and c, timeout=30
    )
    assert later.message == node.deferred_message(1500, used - 200)
    assert later.last_transition_time == first.last_transition_time
    assert later.observed_generation == tracked(patched.metadata.generation)
    assert reasons(core, ns, "p") == ["ResizeDeferred"]


def test_a_new_resize_still_deferred_keeps_the_transition_time_and_records_an_event(
    core, ns, node, tracked
):
    start(core, ns, pod("p", "500m", node=node.name))
    node.fill(ns)
    used = node.used() - 500  # by the other pods
    resize_cpu(core, ns, "p", "1500m")
    first = wait_for(lambda: deferred(core, ns, "p"), timeout=30)
    wait_past_second(first.last_transition_time)
    again = resize_cpu(core, ns, "p", "2500m")
    later = wait_for(
        lambda: (
            (c := deferred(core, ns, "p"))
            and c.observed_generation == tracked(again.metadata.generation)
            and c.message == node.deferred_message(2500, used)
            and c
        ),
        timeout=30,
    )
    assert later.last_transition_time == first.last_transition_time
    deferrals = wait_for(
        lambda: len(evs := events(core, ns, "p")) == 2 and evs,
    )
    assert [e.reason for e in deferrals] == ["ResizeDeferred", "ResizeDeferred"]
    assert [event_json(e)["generation"] for e in deferrals] == [
        again.metadata.generation - 1,
        again.metadata.generation,
    ]


# --- resizePolicy RestartContainer ----------------------------------------------------------
def test_restart_container_policy_restarts_the_container_once_per_resize(core, ns):
    body = pod("p", "100m", guaranteed=True)
    body["spec"]["containers"][0]["resizePolicy"] = [
        {"resourceName": "cpu", "restartPolicy": "RestartContainer"},
        {"resourceName": "memory", "restartPolicy": "NotRequired"},
    ]
    assert status_of(start(core, ns, body)).restart_count == 0

    resize_cpu(core, ns, "p", "200m", guaranteed=True)
    wait_for(lambda: resize_done(core, ns, "p", "200m"), timeout=60)
    assert status_of(core.read_namespaced_pod("p", ns)).restart_count == 1

    memory = {"requests": {"memory": "96Mi"}, "limits": {"memory": "96Mi"}}
    core.patch_namespaced_pod_resize(
        "p", ns, {"spec": {"containers": [{"name": "c0", "resources": memory}]}}
    )
    wait_for(
        lambda: status_of(core.read_namespaced_pod("p", ns)).resources.limits["memory"] == "96Mi",
        timeout=60,
    )
    assert status_of(core.read_namespaced_pod("p", ns)).restart_count == 1  # NotRequired

    both = {
        "requests": {"cpu": "300m", "memory": "128Mi"},
        "limits": {"cpu": "300m", "memory": "128Mi"},
    }
    core.patch_namespaced_pod_resize(
        "p", ns, {"spec": {"containers": [{"name": "c0", "resources": both}]}}
    )
    wait_for(lambda: resize_done(core, ns, "p", "300m"), timeout=60)
    assert status_of(core.read_namespaced_pod("p", ns)).restart_count == 2  # RestartContainer wins


# --- retries: the ticker, and the order -------------------------------------------------------
def test_deferred_resize_is_retried_by_the_ticker_without_any_trigger(core, ns, node):
    """A pod ending (here: its activeDeadlineSeconds run out) frees room, but in 1.35 that is
    no retry trigger: only the periodic retry can pick the deferred resize up."""
    start(core, ns, pod("p", "500m", node=node.name))
    node.fill(ns, activeDeadlineSeconds=2)
    resize_cpu(core, ns, "p", "1500m")
    wait_for(lambda: deferred(core, ns, "p"), timeout=30)
    failed = wait_for(
        lambda: (f := core.read_namespaced_pod("filler", ns)).status.phase == "Failed" and f,
        timeout=60,
    )
    assert (failed.status.reason, failed.status.message) == (
        "DeadlineExceeded",
        "Pod was active on the node longer than the specified deadline",
    )
    wait_for(lambda: resize_done(core, ns, "p", "1500m"), timeout=TICKER_WAIT_S)
    assert completed_reasons(core, ns, "p") == [
        "ResizeDeferred",
        "ResizeStarted",
        "ResizeCompleted",
    ]


def two_deferred(
    core: client.CoreV1Api,
    ns: str,
    node: Node,
    first: dict[str, Any],
    second: dict[str, Any],
    *,
    guaranteed: tuple[bool, bool] = (False, False),
) -> tuple[str, str]:
    """Two pinned 500m pods on a full node, each asking for 1500m (deferred, `first` first),
    and a 1000m pod whose deletion makes room for exactly one of them."""
    for body in (first, second):
        start(core, ns, body)
    start(core, ns, pod("spare", "1000m", node=node.name))
    node.fill(ns)
    names = (first["metadata"]["name"], second["metadata"]["name"])
    for name, g in zip(names, guaranteed, strict=True):
        resize_cpu(core, ns, name, "1500m", guaranteed=g)
        wait_for(lambda n=name: deferred(core, ns, n), timeout=30)
    core.delete_namespaced_pod("spare", ns, grace_period_seconds=0)
    return names


def only_one_grew(core: client.CoreV1Api, ns: str, winner: str, loser: str) -> None:
    wait_for(lambda: resize_done(core, ns, winner, "1500m"), timeout=60)
    assert deferred(core, ns, loser) is not None
    assert actual_cpu(core, ns, loser) == "500m"


def test_retry_order_higher_priority_first(core, ns, node, priority):
    low = pod("low", "500m", node=node.name)
    high = pod("high", "500m", node=node.name)
    priority(high, 1000)
    two_deferred(core, ns, node, low, high)  # low waits longer, high has priority
    only_one_grew(core, ns, "high", "low")


def test_retry_order_guaranteed_before_burstable(core, ns, node):
    burstable = pod("burstable", "500m", node=node.name)
    guaranteed = pod("guaranteed", "500m", node=node.name, guaranteed=True)
    two_deferred(core, ns, node, burstable, guaranteed, guaranteed=(False, True))
    only_one_grew(core, ns, "guaranteed", "burstable")


def test_retry_order_longest_pending_first(core, ns, node):
    # names sort against age: the order cannot come from the names
    two_deferred(
        core, ns, node, pod("z-old", "500m", node=node.name), pod("a-new", "500m", node=node.name)
    )
    only_one_grew(core, ns, "z-old", "a-new")


# --- sidecars (restartable init containers) ---------------------------------------------------
def with_sidecar(name: str, cpu: str, sidecar_cpu: str, **kw: Any) -> dict[str, Any]:
    return pod(
        name,
        cpu,
        init=[
            container("setup", "50m"),
            container("sidecar", sidecar_cpu, restartPolicy="Always"),
        ],
        **kw,
    )


def test_init_container_statuses_report_sidecars_running_and_init_containers_completed(core, ns):
    p = start(core, ns, with_sidecar("p", "100m", "200m"))
    setup, sidecar = p.status.init_container_statuses
    assert setup.name == "setup" and setup.state.terminated.reason == "Completed"
    assert setup.state.terminated.exit_code == 0 and not setup.ready
    assert sidecar.name == "sidecar" and sidecar.state.running is not None
    assert sidecar.ready and sidecar.started and sidecar.restart_count == 0
    assert sidecar.allocated_resources == {"cpu": "200m", "memory": "64Mi"}
    assert sidecar.resources.requests == {"cpu": "200m", "memory": "64Mi"}


def test_sidecar_requests_count_in_the_node_capacity_check(core, ns, node, server_minor, tracked):
    start(core, ns, with_sidecar("p", "100m", "1000m", node=node.name))
    # the container alone would fit the node; with its sidecar the pod does not: 1.36's
    # admission says so (403), 1.33-1.35's kubelet marks it Infeasible
    target = node.capacity - 1000 + 1
    if server_minor >= 36:
        with pytest.raises(ApiException) as refused:
            resize_cpu(core, ns, "p", f"{target}m")
        assert json.loads(refused.value.body)["message"] == (
            'pods "p" is forbidden: node didn\'t have enough allocatable resources: cpu, '
            f"requested: {node.capacity + 1}, allocatable: {node.capacity}"
        )
    else:
        patched = resize_cpu(core, ns, "p", f"{target}m")
        cond = wait_for(lambda: condition(core, ns, "p", PENDING), timeout=30)
        assert (cond.reason, cond.message) == (
            "Infeasible",
            f"Node didn't have enough capacity: cpu, requested: {node.capacity + 1}, "
            f"capacity: {node.capacity}",
        )
        assert cond.observed_generation == tracked(patched.metadata.generation)
        resize_cpu(core, ns, "p", "100m")
        wait_for(lambda: condition(core, ns, "p", PENDING) is None, timeout=30)
    # ...and other pods' sidecars count in what the node uses
    start(core, ns, pod("q", "500m", node=node.name))
    node.fill(ns)
    used = node.used() - 500  # by the other pods: p's 1100m, its sidecar included
    resize_cpu(core, ns, "q", "1500m")
    cond = wait_for(lambda: deferred(core, ns, "q"), timeout=30)
    assert cond.message == node.deferred_message(1500, used)


def test_sidecar_resize_is_allocated_and_actuated_like_a_containers(core, ns):
    start(core, ns, with_sidecar("p", "100m", "200m"))
    patched = resize_cpu(core, ns, "p", "300m", container_name="sidecar", field="initContainers")
    assert patched.spec.init_containers[1].resources.requests["cpu"] == "300m"

    def finished(p: client.V1Pod) -> bool:
        return status_of(p, "sidecar").resources.requests["cpu"] == "300m" and not (
            {PENDING, IN_PROGRESS} & set(conditions(p))
        )

    states = watch_pod(core, ns, "p", patched.metadata.resource_version, finished)
    for s in states:
        if IN_PROGRESS in conditions(s):
            assert status_of(s, "sidecar").allocated_resources["cpu"] == "300m"
            assert status_of(s, "sidecar").resources.requests["cpu"] == "200m"
    done = states[-1]
    assert status_of(done, "sidecar").allocated_resources["cpu"] == "300m"
    assert status_of(done, "c0").resources.requests["cpu"] == "100m"
    assert status_of(done, "sidecar").restart_count == 0
    completed = wait_for(
        lambda: [e for e in events(core, ns, "p") if e.reason == "ResizeCompleted"], timeout=30
    )[0]
    assert event_json(completed)["initContainers"] == [
        {"name": "sidecar", "resources": {"requests": {"cpu": "300m", "memory": "64Mi"}}}
    ]


# --- needs the sandbox: an actuation delay to look into, and no retry ticker --------------------
@pytest.fixture
def slow(make_sandbox, tmp_path) -> Iterator[client.CoreV1Api]:
    """Needs the sandbox: one 4-CPU node that takes 2 s to actuate a resize and whose
    retry ticker never fires within a test."""
    sb = make_sandbox(
        node_cpu=4000,
        node_memory=16 * GI,
        timing=KubeletTiming(actuation_delay_s=2.0, retry_initial_s=3600, retry_interval_s=3600),
    )
    api = client_for(sb, tmp_path)
    yield client.CoreV1Api(api)
    api.close()
    assert sb.kubelet.errors == []


def test_pending_and_in_progress_coexist_when_a_new_resize_cannot_be_allocated(slow):
    core, ns = slow, "default"
    start(core, ns, pod("p", "1"))
    first = resize_cpu(core, ns, "p", "2")
    wait_for(lambda: condition(core, ns, "p", IN_PROGRESS))
    second = resize_cpu(core, ns, "p", "5")  # more than the node has: Infeasible
    p = wait_for(
        lambda: PENDING in conditions(p := core.read_namespaced_pod("p", ns)) and p, timeout=1.5
    )
    both = conditions(p)
    assert IN_PROGRESS in both, "the first resize was still being actuated"
    assert both[IN_PROGRESS].observed_generation == first.metadata.generation
    assert (both[PENDING].reason, both[PENDING].observed_generation) == (
        "Infeasible",
        second.metadata.generation,
    )
    assert p.status.observed_generation == second.metadata.generation
    assert status_of(p).allocated_resources["cpu"] == "2"
    assert status_of(p).resources.requests["cpu"] == "1"
    # the first resize still finishes; the second stays pending
    wait_for(lambda: actual_cpu(core, ns, "p") == "2", timeout=10)
    wait_for(lambda: condition(core, ns, "p", IN_PROGRESS) is None)
    assert condition(core, ns, "p", PENDING).reason == "Infeasible"


def test_a_new_resize_that_fits_replaces_the_one_in_progress_without_pending(slow):
    core, ns = slow, "default"
    start(core, ns, pod("p", "1"))
    resize_cpu(core, ns, "p", "2")
    wait_for(lambda: condition(core, ns, "p", IN_PROGRESS))
    second = resize_cpu(core, ns, "p", "3")
    cond = wait_for(
        lambda: (
            (c := condition(core, ns, "p", IN_PROGRESS))
            and c.observed_generation == second.metadata.generation
            and c
        ),
        timeout=1.5,
    )
    assert cond.reason is None
    p = core.read_namespaced_pod("p", ns)
    assert PENDING not in conditions(p)
    assert status_of(p).allocated_resources["cpu"] == "3"
    assert status_of(p).resources.requests["cpu"] == "1"
    wait_for(lambda: resize_done(core, ns, "p", "3"), timeout=10)
    assert completed_reasons(core, ns, "p") == ["ResizeStarted", "ResizeStarted", "ResizeCompleted"]


def test_retry_order_a_resize_that_frees_room_goes_first(slow):
    """A shrink is allocated before the deferred resizes in the same retry: the room it frees
    is given out at once, not after the shrink is actuated."""
    core, ns = slow, "default"
    start(core, ns, pod("shrinker", "2"))
    start(core, ns, pod("grower", "1"))
    start(core, ns, pod("filler", "1"))
    resize_cpu(core, ns, "grower", "2")
    wait_for(lambda: deferred(core, ns, "grower"))
    resize_cpu(core, ns, "shrinker", "1")
    wait_for(
        lambda: status_of(core.read_namespaced_pod("grower", ns)).allocated_resources["cpu"] == "2",
        timeout=1.5,
    )
    shrinker = core.read_namespaced_pod("shrinker", ns)
    assert IN_PROGRESS in conditions(shrinker), "the shrink was still being actuated"
    assert status_of(shrinker).resources.requests["cpu"] == "2"
