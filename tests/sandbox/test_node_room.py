"""The nodes' room as the planner gets it (`activities/node_room.py`, issue #44 item 3), in
both worlds: allocatable minus what the scheduler charges each pod bound to the node —
other workloads' pods in other namespaces too, a resize the kubelet defers at its desired
size — following pods as they come, grow and go."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client

from raysize.activities.node_room import NodeRooms, pod_charge
from tests.sandbox.conftest import empty_namespace, wait_for
from tests.sandbox.test_conformance_kubelet import (
    cpu_used,
    deferred,
    millis,
    pod,
    resize_cpu,
    start,
)
from tests.sandbox.test_scheduler_and_controllers import kubelet_nodes


@pytest.fixture
def rooms(core: client.CoreV1Api) -> Iterator[NodeRooms]:
    watch = NodeRooms(core, timeout_s=5)
    try:
        yield watch
    finally:
        watch.close()


@pytest.fixture
def other_ns(core: client.CoreV1Api) -> Iterator[str]:
    """Another tenant's namespace: its pods take room on the same nodes."""
    name = f"other-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        empty_namespace(core.api_client, name)


def room_cpu(rooms: NodeRooms, node: str) -> int | None:
    found = rooms.rooms([node]).get(node)
    return None if found is None else found.cpu


def test_a_nodes_room_follows_every_pod_bound_to_it(
    core: client.CoreV1Api, ns: str, other_ns: str, rooms: NodeRooms
) -> None:
    nodes = kubelet_nodes(core)
    node, allocatable = sorted(nodes.items())[0]

    def expected() -> int:
        return allocatable - cpu_used(core, node)

    # as the server has it now (the scheduler's own sum, from the test's list)
    wait_for(lambda: room_cpu(rooms, node) == expected(), timeout=30)
    before = expected()
    # another tenant's pod takes room on it: the room shrinks by its request
    start(core, other_ns, pod("tenant-b", "1500m", node=node))
    wait_for(lambda: room_cpu(rooms, node) == before - 1500, timeout=30)
    # a Ray pod of ours there, grown past the room left: the kubelet defers it, and the
    # scheduler charges it at its desired size, so the node has less than nothing left
    start(core, ns, pod("w1", "500m", node=node, guaranteed=True))
    left = before - 1500 - 500
    resize_cpu(core, ns, "w1", f"{500 + left + 1000}m", guaranteed=True)
    wait_for(lambda: deferred(core, ns, "w1"), timeout=30)
    wait_for(lambda: room_cpu(rooms, node) == -1000, timeout=30)
    assert pod_charge(
        core.api_client.sanitize_for_serialization(core.read_namespaced_pod("w1", ns))
    )[1] == (500 + left + 1000)
    # the other tenant's pod goes: its room comes back
    core.delete_namespaced_pod("tenant-b", other_ns, grace_period_seconds=0)
    wait_for(lambda: room_cpu(rooms, node) == 500, timeout=30)
    assert millis(f"{allocatable}m") == allocatable
