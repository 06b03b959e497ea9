"""The sandbox's watch window: what the real server's watch cache does when it fills."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from raysize.sandbox.cluster import Sandbox, SandboxConfig
from tests.sandbox.conftest import client_for, pod_body


def test_a_watch_from_before_a_full_window_is_gone(tmp_path: Path) -> None:
    """Like the watch cache once events fell out of its window: HTTP 200, then one ERROR
    event carrying a 410 Expired Status; the client's Watch raises it as an ApiException.
    A watch from inside the window replays what came after."""
    sb = Sandbox(SandboxConfig(watch_history=5)).start()
    try:
        core = client.CoreV1Api(client_for(sb, tmp_path))
        first = core.create_namespaced_pod("default", pod_body("w"))
        for i in range(8):
            core.patch_namespaced_pod("w", "default", {"metadata": {"labels": {"i": str(i)}}})
        response = core.list_namespaced_pod(
            "default", watch=True, resource_version=first.metadata.resource_version,
            timeout_seconds=2, _preload_content=False,
        )  # fmt: skip
        assert response.status == 200
        events = [json.loads(line) for line in response.read().splitlines() if line]
        assert [e["type"] for e in events] == ["ERROR"]
        status = events[0]["object"]
        assert (status["kind"], status["status"], status["code"], status["reason"]) == (
            "Status",
            "Failure",
            410,
            "Expired",
        )
        assert re.fullmatch(r"too old resource version: \d+ \(\d+\)", status["message"]), status
        with pytest.raises(ApiException) as exc:
            for _ in watch.Watch().stream(
                core.list_namespaced_pod, "default",
                resource_version=first.metadata.resource_version, timeout_seconds=2,
            ):  # fmt: skip
                pass
        assert exc.value.status == 410
        assert re.fullmatch(r"Expired: too old resource version: \d+ \(\d+\)", exc.value.reason)
        latest = core.read_namespaced_pod("w", "default").metadata.resource_version
        core.patch_namespaced_pod("w", "default", {"metadata": {"labels": {"i": "last"}}})
        recent = core.list_namespaced_pod(
            "default", watch=True, resource_version=latest, timeout_seconds=1,
            _preload_content=False,
        )  # fmt: skip
        kinds = [json.loads(line)["type"] for line in recent.read().splitlines() if line]
        assert kinds == ["MODIFIED"]
    finally:
        sb.close()


def test_deletecollection_passes_over_a_pod_deleted_since_its_list(tmp_path: Path) -> None:
    """Another client (KubeRay, the kubelet) deletes a pod between the collection's list
    and its delete: the real server's deletecollection takes "gone" as done. The embedded
    one answered 404 for the whole call (a test's namespace teardown failed on it)."""
    sb = Sandbox(SandboxConfig()).start()
    try:
        core = client.CoreV1Api(client_for(sb, tmp_path))
        for name in ("a", "b", "c"):
            core.create_namespaced_pod("default", pod_body(name))
        listed = sb.store.list

        def list_then_lose_b(*args: object, **kwargs: object) -> object:
            items = listed(*args, **kwargs)  # type: ignore[arg-type]
            if args and args[0] == "pods":
                core.delete_namespaced_pod("b", "default", grace_period_seconds=0)
            return items

        sb.store.list = list_then_lose_b  # type: ignore[method-assign]
        core.delete_collection_namespaced_pod("default", grace_period_seconds=0)
        sb.store.list = listed  # type: ignore[method-assign]
        assert core.list_namespaced_pod("default").items == []
    finally:
        sb.close()
