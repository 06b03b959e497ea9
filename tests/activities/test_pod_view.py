"""The Kubernetes → planner translation on plain dicts (no API server): what the planner
is told about a pod's age, its failures and its resize."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from raysize.activities.k8s_objects import pod_view


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
