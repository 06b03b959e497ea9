"""The Kubernetes → planner translation on plain dicts (no API server): what the planner
is told about a pod's age, its failures and its resize."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from raysize.activities.k8s_objects import pod_view, ray_autoscaler_running


def _pod(*, phase: str = "Running", start: str | None = None, status: dict | None = None) -> dict:
    pod_status: dict = {"phase": phase}
    if start is not None:
        pod_status["startTime"] = start
    annotations = {"ray.io/ippr-status": json.dumps(status)} if status else {}
    return {
        "metadata": {"name": "w1", "labels": {"ray.io/group": "g1"}, "annotations": annotations},
        "spec": {
            "containers": [
                {"name": "ray", "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}
            ]
        },
        "status": pod_status,
    }


NOW = datetime(2026, 11, 24, 6, 0, 0, tzinfo=UTC).timestamp()


def test_a_running_pod_says_how_long_it_has_run() -> None:
    assert pod_view(_pod(start="2026-11-24T05:50:00Z"), now=NOW).running_s == 600
    assert pod_view(_pod(), now=NOW).running_s == 0  # no startTime yet
    assert pod_view(_pod(start="garbage"), now=NOW).running_s == 0
    pending = pod_view(_pod(phase="Pending", start="2026-11-24T05:50:00Z"), now=NOW)
    assert pending.running_s == 0


def test_a_failure_record_says_how_old_it_is() -> None:
    at = int(NOW) - 90
    view = pod_view(_pod(status={"last-failed-at": at, "last-failed-reason": "x"}), now=NOW)
    assert view.failed and view.failed_age_s == 90
    assert not pod_view(_pod(), now=NOW).failed


# --- Ray's autoscaler left running in the head (KubeRay's `autoscaler` sidecar) -------------
def _head(name: str, autoscaler_state: dict | None, node_type: str = "head") -> dict:
    statuses = [{"name": "ray-head", "state": {"running": {}}}]
    if autoscaler_state is not None:
        statuses.append({"name": "autoscaler", "state": autoscaler_state})
    return {
        "metadata": {"name": name, "labels": {"ray.io/node-type": node_type}},
        "status": {"containerStatuses": statuses},
    }


def test_the_head_whose_autoscaler_container_runs_is_named() -> None:
    assert ray_autoscaler_running([_head("h", {"running": {"startedAt": "x"}})]) == "h"


@pytest.mark.parametrize(
    "pods",
    [
        [_head("h", None)],  # no sidecar: in-tree autoscaling was never on
        [_head("h", {"terminated": {"exitCode": 0}})],  # stopped (v2: restartPolicy Never)
        [_head("h", {"waiting": {"reason": "CrashLoopBackOff"}})],
        [_head("w", {"running": {}}, node_type="worker")],  # only the head's counts
    ],
)
def test_no_running_autoscaler_container_names_no_pod(pods: list[dict]) -> None:
    assert ray_autoscaler_running(pods) == ""
