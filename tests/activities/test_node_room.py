"""The scheduler's charge of a pod as the node room counts it, and a role without the
node-room grant (`activities/node_room.py`). The informers against both worlds' API
servers: tests/sandbox/test_node_room.py."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from raysize.activities.node_room import NodeRooms, pod_charge


def container(name: str, cpu: str, memory: str = "1Gi", **extra: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"requests": {"cpu": cpu, "memory": memory}}, **extra}


def test_a_pod_is_charged_its_largest_of_desired_allocated_and_actual() -> None:
    pod = {
        "spec": {
            "nodeName": "n1",
            "containers": [container("ray", "4"), container("side", "500m", "256Mi")],
        },
        "status": {
            "containerStatuses": [
                # a grow to 4 the kubelet deferred: allocated and actual still 1
                {"name": "ray", "allocatedResources": {"cpu": "1", "memory": "1Gi"},
                 "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
                # a shrink in progress: actual still above desired
                {"name": "side", "resources": {"requests": {"cpu": "2", "memory": "256Mi"}}},
            ]
        },
    }  # fmt: skip
    assert pod_charge(pod) == ("n1", 4000 + 2000, 2**30 + 256 * 2**20)


def test_init_containers_sidecars_and_overhead_count_as_the_scheduler_counts_them() -> None:
    pod = {
        "spec": {
            "nodeName": "n1",
            "overhead": {"cpu": "100m", "memory": "10Mi"},
            "initContainers": [
                container("sidecar", "250m", "0", restartPolicy="Always"),
                container("setup", "3", "0"),  # alone, beside the sidecar before it
            ],
            "containers": [container("ray", "1", "0")],
        }
    }
    # max(1 + 0.25, 0.25 + 3) + 0.1
    assert pod_charge(pod) == ("n1", 3350, 10 * 2**20)
    # limits only: the API server defaulted requests to them
    only_limits = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "2"}}}]}}
    assert pod_charge(only_limits) == ("", 2000, 0)


class Forbidden:
    """A CoreV1Api whose node and pod lists are refused (403), counted."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def _refuse(self, *a: Any, **kw: Any) -> Any:
        with self.lock:
            self.calls += 1
        raise ApiException(status=403, reason="Forbidden")

    list_node = list_pod_for_all_namespaces = _refuse


def test_without_the_grant_plans_go_on_without_node_room_and_it_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    core = Forbidden()
    rooms = NodeRooms(core)
    try:
        with caplog.at_level(logging.INFO, logger="raysize.activities"):
            asyncio.run(rooms.started(5.0))  # returns once refused: never waits it out
            assert rooms.rooms(["n1"]) == {}
            threading.Event().wait(0.3)
            asked = core.calls
            threading.Event().wait(0.3)
        said = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert len(said) == 1, said
        assert "get/list/watch on nodes" in said[0]
        # one refusal holds both informers for FORBIDDEN_RETRY_S: no request meanwhile
        assert 1 <= asked <= 2 and core.calls == asked
    finally:
        rooms.close()
