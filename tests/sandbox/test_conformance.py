"""Black-box conformance: docs/design/kubernetes-resize.md §1 and §2 through the real `kubernetes` client.

Only the `kube`/`core`/`ns` fixtures are used, so with RAYSIZE_TEST_KUBECONFIG pointing
at a real v1.35 cluster these tests run unchanged against it.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from raysize.workflows.resources import CPU, quantity_to_units
from tests.sandbox.conftest import PARKED_NODE, PAUSE_IMAGE, pod_body, wait_for

APPLY = "application/apply-patch+yaml"
BURSTABLE = {
    "requests": {"cpu": "100m", "memory": "64Mi"},
    "limits": {"cpu": "200m", "memory": "128Mi"},
}


def running_pod(core: client.CoreV1Api, ns: str, name: str, **kwargs: Any) -> client.V1Pod:
    core.create_namespaced_pod(ns, pod_body(name, **kwargs))
    return wait_for(
        lambda: (p := core.read_namespaced_pod(name, ns)).status.phase == "Running" and p,
        timeout=60,
    )


def parked_pod(core: client.CoreV1Api, ns: str, body: dict[str, Any]) -> client.V1Pod:
    body["spec"]["nodeName"] = PARKED_NODE
    return core.create_namespaced_pod(ns, body)


def with_init_container(name: str, restart_policy: str | None = None) -> dict[str, Any]:
    """A Burstable pod with one init container `i0` (a sidecar if restart_policy="Always")."""
    body = pod_body(name, **BURSTABLE)
    init: dict[str, Any] = {"name": "i0", "image": PAUSE_IMAGE, "resources": BURSTABLE}
    if restart_policy:
        init["restartPolicy"] = restart_policy
    body["spec"]["initContainers"] = [init]
    return body


def status_of(exc: pytest.ExceptionInfo[ApiException]) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.value.body)
    return body


def resize(core: client.CoreV1Api, ns: str, name: str, body: Any, **kw: Any) -> client.V1Pod:
    return core.patch_namespaced_pod_resize(name, ns, body, **kw)


def conditions(pod: client.V1Pod) -> dict[str, client.V1PodCondition]:
    return {c.type: c for c in pod.status.conditions or []}


# --- §1: the resize subresource -----------------------------------------------------------
def test_resize_bumps_generation_and_leaves_status_to_the_kubelet(core, ns):
    before = running_pod(core, ns, "p", **BURSTABLE)
    after = resize(
        core,
        ns,
        "p",
        {"spec": {"containers": [{"name": "c0", "resources": {"requests": {"cpu": "150m"}}}]}},
    )
    assert after.metadata.generation == before.metadata.generation + 1
    assert after.spec.containers[0].resources.requests["cpu"] == "150m"
    assert after.status.container_statuses[0].allocated_resources["cpu"] == "100m"
    # resourceVersions are opaque: only equality means anything.
    assert after.metadata.resource_version != before.metadata.resource_version


def test_resize_with_json_patch_and_merge_patch(core, ns):
    running_pod(core, ns, "p", **BURSTABLE)
    pod = resize(
        core,
        ns,
        "p",
        [
            {"op": "replace", "path": "/spec/containers/0/resources/requests/cpu", "value": "120m"},
            {"op": "replace", "path": "/spec/containers/0/resources/limits/cpu", "value": "220m"},
        ],
    )
    assert pod.spec.containers[0].resources.limits["cpu"] == "220m"
    pod = resize(
        core,
        ns,
        "p",
        {
            "spec": {
                "containers": [
                    {
                        "name": "c0",
                        "image": "x",
                        "resources": {
                            "requests": {"cpu": "130m", "memory": "64Mi"},
                            "limits": {"cpu": "230m", "memory": "128Mi"},
                        },
                    }
                ]
            }
        },
        _content_type="application/merge-patch+json",
    )
    assert pod.spec.containers[0].resources.requests["cpu"] == "130m"
    assert pod.spec.containers[0].image != "x"  # only resources come from a resize


def test_merge_patch_dropping_resize_policy_is_rejected(core, ns):
    core.create_namespaced_pod(
        ns,
        {
            **pod_body("p", **BURSTABLE),
            "spec": {
                **pod_body("p", **BURSTABLE)["spec"],
                "containers": [
                    {
                        **pod_body("p", **BURSTABLE)["spec"]["containers"][0],
                        "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
                    }
                ],
            },
        },
    )
    with pytest.raises(ApiException) as exc:
        resize(
            core,
            ns,
            "p",
            {"spec": {"containers": [{"name": "c0", "resources": BURSTABLE}]}},
            _content_type="application/merge-patch+json",
        )
    assert exc.value.status == 422
    assert status_of(exc)["message"] == (
        'Pod "p" is invalid: spec: Forbidden: only cpu and memory resources are mutable'
    )


def test_qos_class_change_is_invalid(core, ns):
    running_pod(core, ns, "p", **BURSTABLE)
    with pytest.raises(ApiException) as exc:
        resize(
            core,
            ns,
            "p",
            {
                "spec": {
                    "containers": [
                        {
                            "name": "c0",
                            "resources": {"requests": {"cpu": "200m", "memory": "128Mi"}},
                        }
                    ]
                }
            },
        )
    body = status_of(exc)
    assert (exc.value.status, body["reason"], body["code"]) == (422, "Invalid", 422)
    assert body["message"] == (
        'Pod "p" is invalid: spec: Invalid value: "Burstable": '
        "Pod QOS Class may not change as a result of resizing"
    )
    assert body["details"] == {
        "name": "p",
        "kind": "Pod",
        "causes": [
            {
                "reason": "FieldValueInvalid",
                "message": 'Invalid value: "Burstable": Pod QOS Class may not change as a result of '
                "resizing",
                "field": "spec",
            }
        ],
    }


def test_removing_requests_is_forbidden(core, ns):
    running_pod(core, ns, "p", requests={"cpu": "100m", "memory": "64Mi"})
    with pytest.raises(ApiException) as exc:
        resize(
            core, ns, "p", [{"op": "remove", "path": "/spec/containers/0/resources/requests/cpu"}]
        )
    assert status_of(exc)["message"] == (
        'Pod "p" is invalid: spec.containers[0].resources.requests: Forbidden: '
        "resource requests cannot be removed"
    )


def test_removing_limits_is_forbidden(core, ns):
    running_pod(core, ns, "p", **BURSTABLE)
    with pytest.raises(ApiException) as exc:
        resize(core, ns, "p", [{"op": "remove", "path": "/spec/containers/0/resources/limits/cpu"}])
    assert status_of(exc)["message"] == (
        'Pod "p" is invalid: spec.containers[0].resources.limits: Forbidden: '
        "resource limits cannot be removed"
    )


def test_only_cpu_and_memory_are_mutable(core, ns):
    running_pod(core, ns, "p", **BURSTABLE)
    with pytest.raises(ApiException) as exc:
        resize(
            core,
            ns,
            "p",
            [
                {
                    "op": "add",
                    "path": "/spec/containers/0/resources/requests/ephemeral-storage",
                    "value": "1Gi",
                }
            ],
        )
    assert status_of(exc)["message"] == (
        'Pod "p" is invalid: spec: Forbidden: only cpu and memory resources are mutable'
    )


def test_resize_policy_is_immutable(core, ns):
    running_pod(core, ns, "p", **BURSTABLE)
    with pytest.raises(ApiException) as exc:
        resize(
            core,
            ns,
            "p",
            [
                {
                    "op": "add",
                    "path": "/spec/containers/0/resizePolicy",
                    "value": [{"resourceName": "cpu", "restartPolicy": "RestartContainer"}],
                }
            ],
        )
    body = status_of(exc)
    assert (exc.value.status, body["reason"]) == (422, "Invalid")
    assert body["message"] == (
        'Pod "p" is invalid: spec: Forbidden: only cpu and memory resources are mutable'
    )
    assert core.read_namespaced_pod("p", ns).spec.containers[0].resize_policy in (None, [])


def test_containers_may_not_be_added_removed_or_renamed(core, ns):
    running_pod(core, ns, "p", containers=2, **BURSTABLE)
    with pytest.raises(ApiException) as exc:
        resize(core, ns, "p", [{"op": "remove", "path": "/spec/containers/1"}])
    assert status_of(exc)["message"] == (
        'Pod "p" is invalid: spec.containers: Forbidden: '
        "containers may not be added or removed on resize"
    )
    with pytest.raises(ApiException) as exc:
        resize(
            core,
            ns,
            "p",
            [
                {"op": "replace", "path": "/spec/containers/0/name", "value": "c1"},
                {"op": "replace", "path": "/spec/containers/1/name", "value": "c0"},
            ],
        )
    assert status_of(exc)["message"] == (
        'Pod "p" is invalid: [spec.containers[0].name: Forbidden: containers may not be renamed '
        "or reordered on resize, spec.containers[1].name: Forbidden: containers may not be "
        "renamed or reordered on resize]"
    )


def test_pod_level_resources_must_cover_the_containers_after_a_resize(core, ns, server_minor):
    """A pod-level limit defaults the pod-level request to what the containers ask (100m).
    1.36 resizes such pods, but the pod-level request must still cover the containers;
    1.34 and 1.35 cannot resize them at all; 1.33 has no pod-level resources (the
    PodLevelResources gate is alpha, off: the field is dropped) and resizes the container."""
    body = pod_body("p", **BURSTABLE)
    body["spec"]["resources"] = {"limits": {"cpu": "1", "memory": "1Gi"}}
    created = core.create_namespaced_pod(ns, body)
    if server_minor <= 33:
        assert created.spec.resources is None
        pod = resize(
            core,
            ns,
            "p",
            {"spec": {"containers": [{"name": "c0", "resources": {"requests": {"cpu": "150m"}}}]}},
        )
        assert pod.spec.containers[0].resources.requests["cpu"] == "150m"
        return
    assert created.spec.resources.requests == {"cpu": "100m", "memory": "64Mi"}
    with pytest.raises(ApiException) as exc:
        resize(
            core,
            ns,
            "p",
            {"spec": {"containers": [{"name": "c0", "resources": {"requests": {"cpu": "150m"}}}]}},
        )
    if server_minor >= 36:
        assert status_of(exc)["message"] == (
            'Pod "p" is invalid: spec.resources.requests[cpu]: Invalid value: "100m": must be '
            "greater than or equal to aggregate container requests of 150m"
        )
    else:
        assert "pod-level resources" in status_of(exc)["message"]


def test_request_above_limit_is_invalid(core, ns):
    running_pod(core, ns, "p", **BURSTABLE)
    with pytest.raises(ApiException) as exc:
        resize(
            core,
            ns,
            "p",
            [
                {
                    "op": "replace",
                    "path": "/spec/containers/0/resources/requests/cpu",
                    "value": "300m",
                }
            ],
        )
    assert status_of(exc)["message"] == (
        'Pod "p" is invalid: spec.containers[0].resources.requests: Invalid value: "300m": '
        "must be less than or equal to cpu limit of 200m"
    )


def memory_limit_needs_restart(exc: pytest.ExceptionInfo[ApiException], change: str) -> None:
    """1.33's rule (PR #133012 lifted it in 1.34): a memory limit may be lowered or added
    only where the container restarts for memory."""
    rule = f"memory limits cannot be {change} unless resizePolicy is RestartContainer"
    assert (exc.value.status, status_of(exc)["message"]) == (
        422,
        f'Pod "p" is invalid: spec.containers[0].resources.limits[memory]: Forbidden: {rule}',
    )


def test_memory_limit_decrease_passes_validation(core, ns, server_minor):
    running_pod(core, ns, "p", **BURSTABLE)
    change = [
        {"op": "replace", "path": "/spec/containers/0/resources/limits/memory", "value": "96Mi"}
    ]
    if server_minor <= 33:
        with pytest.raises(ApiException) as exc:
            resize(core, ns, "p", change)
        memory_limit_needs_restart(exc, "decreased")
        return
    pod = resize(core, ns, "p", change)
    assert pod.spec.containers[0].resources.limits["memory"] == "96Mi"


def test_memory_limit_addition_passes_validation(core, ns, server_minor):
    pod = parked_pod(
        core, ns, pod_body("p", requests={"cpu": "100m", "memory": "64Mi"}, limits={"cpu": "200m"})
    )
    change = [{"op": "add", "path": "/spec/containers/0/resources/limits/memory", "value": "128Mi"}]
    if server_minor <= 33:
        with pytest.raises(ApiException) as exc:
            resize(core, ns, "p", change)
        memory_limit_needs_restart(exc, "added")
        return
    after = resize(
        core,
        ns,
        "p",
        change,
    )
    assert after.spec.containers[0].resources.limits == {"cpu": "200m", "memory": "128Mi"}
    assert after.metadata.generation == pod.metadata.generation + 1
    assert after.status.qos_class == "Burstable"


def test_restart_container_policy_is_invalid_when_the_pod_never_restarts(core, ns, server_minor):
    body = pod_body("p", **BURSTABLE)
    body["spec"]["restartPolicy"] = "Never"
    body["spec"]["containers"][0]["resizePolicy"] = [
        {"resourceName": "cpu", "restartPolicy": "RestartContainer"}
    ]
    with pytest.raises(ApiException) as exc:
        parked_pod(core, ns, body)
    status = status_of(exc)
    assert (exc.value.status, status["reason"]) == (422, "Invalid")
    rule = "pod `restartPolicy`" if server_minor >= 36 else "`restartPolicy`"  # 1.36 rewording
    assert status["message"] == (
        'Pod "p" is invalid: spec.containers[0].resizePolicy: Invalid value: "RestartContainer": '
        f"must be 'NotRequired' when {rule} is 'Never'"
    )
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "RestartContainer": '
            f"must be 'NotRequired' when {rule} is 'Never'",
            "field": "spec.containers[0].resizePolicy",
        }
    ]
    body["spec"]["containers"][0]["resizePolicy"][0]["restartPolicy"] = "NotRequired"
    created = parked_pod(core, ns, body)
    assert created.spec.containers[0].resize_policy[0].restart_policy == "NotRequired"


def test_static_pods_cannot_be_resized(core, ns):
    body = pod_body("p", annotations={"kubernetes.io/config.mirror": "conformance"}, **BURSTABLE)
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(ns, body)  # a mirror pod must name its node
    assert status_of(exc)["message"] == (
        'Pod "p" is invalid: metadata.annotations[kubernetes.io/config.mirror]: '
        'Invalid value: "conformance": must set spec.nodeName if mirror pod annotation is set'
    )
    parked_pod(core, ns, body)
    with pytest.raises(ApiException) as exc:
        resize(core, ns, "p", {"spec": {"containers": [{"name": "c0", "resources": BURSTABLE}]}})
    status = status_of(exc)
    assert (exc.value.status, status["reason"]) == (422, "Invalid")
    assert status["message"] == 'Pod "p" is invalid: []: Forbidden: static pods cannot be resized'
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueForbidden",
            "message": "Forbidden: static pods cannot be resized",
            "field": "[]",
        }
    ]


def test_windows_pods_cannot_be_resized(core, ns):
    body = pod_body("p", **BURSTABLE)
    body["spec"]["os"] = {"name": "windows"}
    pod = parked_pod(core, ns, body)
    with pytest.raises(ApiException) as exc:
        resize(
            core,
            ns,
            "p",
            {"spec": {"containers": [{"name": "c0", "resources": {"requests": {"cpu": "150m"}}}]}},
        )
    status = status_of(exc)
    assert (exc.value.status, status["reason"]) == (422, "Invalid")
    assert status["message"] == 'Pod "p" is invalid: []: Forbidden: windows pods cannot be resized'
    assert core.read_namespaced_pod("p", ns).metadata.generation == pod.metadata.generation


def test_init_containers_may_not_be_added_removed_or_renamed(core, ns):
    parked_pod(core, ns, with_init_container("p", restart_policy="Always"))
    added_or_removed = (
        'Pod "p" is invalid: spec.initContainers: Forbidden: '
        "initContainers may not be added or removed on resize"
    )
    with pytest.raises(ApiException) as exc:
        resize(core, ns, "p", [{"op": "remove", "path": "/spec/initContainers/0"}])
    assert (exc.value.status, status_of(exc)["message"]) == (422, added_or_removed)
    with pytest.raises(ApiException) as exc:
        resize(
            core,
            ns,
            "p",
            [
                {
                    "op": "add",
                    "path": "/spec/initContainers/-",
                    "value": {"name": "i1", "image": PAUSE_IMAGE, "restartPolicy": "Always"},
                }
            ],
        )
    assert (exc.value.status, status_of(exc)["message"]) == (422, added_or_removed)
    with pytest.raises(ApiException) as exc:
        resize(
            core, ns, "p", [{"op": "replace", "path": "/spec/initContainers/0/name", "value": "i9"}]
        )
    assert (exc.value.status, status_of(exc)["message"]) == (
        422,
        'Pod "p" is invalid: spec.initContainers[0].name: Forbidden: '
        "initContainers may not be renamed or reordered on resize",
    )
    assert [c.name for c in core.read_namespaced_pod("p", ns).spec.init_containers] == ["i0"]


def test_sidecar_resources_resize_like_a_containers(core, ns, server_minor):
    parked_pod(core, ns, with_init_container("p", restart_policy="Always"))
    pod = resize(
        core,
        ns,
        "p",
        {"spec": {"initContainers": [{"name": "i0", "resources": {"requests": {"cpu": "150m"}}}]}},
    )
    assert pod.spec.init_containers[0].resources.requests == {"cpu": "150m", "memory": "64Mi"}
    with pytest.raises(ApiException) as exc:
        resize(
            core,
            ns,
            "p",
            [
                {
                    "op": "add",
                    "path": "/spec/initContainers/0/resources/requests/ephemeral-storage",
                    "value": "1Gi",
                }
            ],
        )
    refusal = (  # 1.36 resizes init containers too, and words it per container
        "spec.initContainers[0]: Forbidden: only cpu and memory resources for init or sidecar "
        "containers are mutable"
        if server_minor >= 36
        else "spec: Forbidden: only cpu and memory resources for sidecar containers are mutable"
    )
    assert (exc.value.status, status_of(exc)["message"]) == (422, f'Pod "p" is invalid: {refusal}')
    with pytest.raises(ApiException) as exc:
        resize(
            core, ns, "p", [{"op": "remove", "path": "/spec/initContainers/0/resources/limits/cpu"}]
        )
    assert (exc.value.status, status_of(exc)["message"]) == (
        422,
        'Pod "p" is invalid: spec.initContainers[0].resources.limits: Forbidden: '
        "resource limits cannot be removed",
    )


def test_non_sidecar_init_container_resize_needs_the_nodes_feature(core, ns, server_minor):
    """Before 1.36 a non-sidecar init container's resources are immutable (docs/design/kubernetes-resize.md §1
    step 9). 1.36 validates the change and its admission asks the pod's Node: one that does
    not declare InPlacePodVerticalScalingInitContainers refuses it with 403."""
    pod = parked_pod(core, ns, with_init_container("p"))
    with pytest.raises(ApiException) as exc:
        resize(
            core,
            ns,
            "p",
            {
                "spec": {
                    "initContainers": [{"name": "i0", "resources": {"requests": {"cpu": "150m"}}}]
                }
            },
        )
    status = status_of(exc)
    if server_minor >= 36:
        assert (exc.value.status, status["reason"]) == (403, "Forbidden")
        assert status["message"] == (
            'pods "p" is forbidden: pod update requires features '
            f'InPlacePodVerticalScalingInitContainers which are not available on node "{PARKED_NODE}"'
        )
    else:
        assert (exc.value.status, status["reason"]) == (422, "Invalid")
        assert status["message"] == (
            'Pod "p" is invalid: spec: Forbidden: resources for non-sidecar init containers are '
            "immutable"
        )
    after = core.read_namespaced_pod("p", ns)
    assert after.spec.init_containers[0].resources.requests["cpu"] == "100m"
    assert after.metadata.generation == pod.metadata.generation


def test_a_resize_of_a_pod_whose_node_is_gone_is_refused_from_1_36(core, ns, server_minor):
    """1.36's resize admission reads the pod's Node: none, no resize (403). Earlier
    versions store the resize and leave it to a kubelet that will never come."""
    node = f"raysize-gone-{ns}"
    body = pod_body("p", **BURSTABLE)
    body["spec"]["nodeName"] = node
    core.create_namespaced_pod(ns, body)
    patch = {"spec": {"containers": [{"name": "c0", "resources": {"requests": {"cpu": "150m"}}}]}}
    if server_minor < 36:
        assert resize(core, ns, "p", patch).spec.containers[0].resources.requests["cpu"] == "150m"
        return
    with pytest.raises(ApiException) as exc:
        resize(core, ns, "p", patch)
    status = status_of(exc)
    assert (exc.value.status, status["reason"]) == (403, "Forbidden")
    assert status["message"] == f'pods "p" is forbidden: node "{node}" not found'
    assert core.read_namespaced_pod("p", ns).spec.containers[0].resources.requests["cpu"] == "100m"


def test_a_container_without_resources_may_gain_cpu_and_memory_only(core, ns, server_minor):
    """Adding ephemeral-storage to a container that had no resources is refused since
    PR #135084 (docs/design/kubernetes-resize.md §1 step 9); a 1.35 without that fix would accept
    it, and 1.33.13 does."""
    body = pod_body("p", containers=2, **BURSTABLE)
    body["spec"]["containers"][1]["resources"] = {}
    parked_pod(core, ns, body)
    storage = [
        {
            "op": "add",
            "path": "/spec/containers/1/resources/requests",
            "value": {"ephemeral-storage": "1Gi"},
        }
    ]
    if server_minor <= 33:
        gained = resize(core, ns, "p", storage)
        assert gained.spec.containers[1].resources.requests == {"ephemeral-storage": "1Gi"}
        return
    with pytest.raises(ApiException) as exc:
        resize(core, ns, "p", storage)
    assert (exc.value.status, status_of(exc)["message"]) == (
        422,
        'Pod "p" is invalid: spec: Forbidden: only cpu and memory resources are mutable',
    )
    pod = resize(
        core,
        ns,
        "p",
        {"spec": {"containers": [{"name": "c1", "resources": {"requests": {"cpu": "50m"}}}]}},
    )
    assert pod.spec.containers[1].resources.requests == {"cpu": "50m"}
    assert pod.status.qos_class == "Burstable"


def test_a_terminating_pod_may_be_resized(core, ns):
    """docs/design/kubernetes-resize.md §1: ValidatePodResize has no check for terminating pods. A finalizer
    keeps the pod terminating (deletionTimestamp set) for as long as the test needs."""
    body = pod_body("p", **BURSTABLE)
    body["metadata"]["finalizers"] = ["raysize.test/hold"]
    body["spec"]["terminationGracePeriodSeconds"] = 30
    core.create_namespaced_pod(ns, body)
    try:
        wait_for(lambda: core.read_namespaced_pod("p", ns).status.phase == "Running", timeout=60)
        core.delete_namespaced_pod("p", ns, grace_period_seconds=30)
        terminating = core.read_namespaced_pod("p", ns)
        assert terminating.metadata.deletion_timestamp is not None
        after = resize(
            core,
            ns,
            "p",
            {"spec": {"containers": [{"name": "c0", "resources": {"requests": {"cpu": "150m"}}}]}},
        )
        assert after.spec.containers[0].resources.requests["cpu"] == "150m"
        assert after.metadata.generation == terminating.metadata.generation + 1
        assert after.metadata.deletion_timestamp is not None
    finally:
        core.patch_namespaced_pod("p", ns, [{"op": "remove", "path": "/metadata/finalizers"}])


def test_server_side_apply_on_the_pod_and_its_resize_subresource(core, ns):
    """docs/design/kubernetes-resize.md §1: /resize takes application/apply-patch+yaml. force=True: the pod's
    creator owns these fields, and a real server answers 409 to a non-forced apply that
    changes them (the sandbox does not track field managers; see sandbox/patch.py)."""
    pod = parked_pod(core, ns, pod_body("p", **BURSTABLE))
    config = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c0", "resources": {"requests": {"cpu": "150m"}}}]},
    }
    with pytest.raises(ApiException) as exc:
        resize(core, ns, "p", config, _content_type=APPLY)
    status = status_of(exc)
    assert (exc.value.status, status["reason"], status["message"]) == (
        422,
        "Invalid",
        'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
        "is required for apply patch",
    )
    assert status["details"] == {
        "group": "meta.k8s.io",
        "kind": "PatchOptions",
        "causes": [
            {
                "reason": "FieldValueRequired",
                "message": "Required value: is required for apply patch",
                "field": "fieldManager",
            }
        ],
    }
    after = resize(
        core, ns, "p", config, _content_type=APPLY, field_manager="raysize-test", force=True
    )
    resources = after.spec.containers[0].resources
    assert resources.requests == {"cpu": "150m", "memory": "64Mi"}  # the rest is kept
    assert resources.limits == BURSTABLE["limits"]
    assert after.metadata.generation == pod.metadata.generation + 1
    labelled = core.patch_namespaced_pod(
        "p",
        ns,
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"by": "apply"}}},
        _content_type=APPLY,
        field_manager="raysize-test",
    )
    assert labelled.metadata.labels == {"app": "conformance", "by": "apply"}
    assert labelled.spec.containers[0].resources.requests["cpu"] == "150m"


def test_an_unknown_patch_type_is_a_bare_415(core, ns):
    """A content type no patch handler knows never reaches the resource: the server's
    bare 415 with empty details (the sandbox used to list the accepted types here)."""
    parked_pod(core, ns, pod_body("p", **BURSTABLE))
    with pytest.raises(ApiException) as exc:
        resize(core, ns, "p", {"spec": {}}, _content_type="application/x-raysize-test+json")
    status = status_of(exc)
    assert (exc.value.status, status["reason"], status["message"], status["details"]) == (
        415,
        "UnsupportedMediaType",
        "415: Unsupported Media Type",
        {},
    )


def test_a_known_patch_type_a_custom_resource_does_not_take_lists_the_accepted_ones(kube, ns):
    """Strategic merge on a RayCluster: the 415 names what a custom resource takes."""
    api = client.CustomObjectsApi(kube)
    with pytest.raises(ApiException) as exc:
        api.patch_namespaced_custom_object(
            "ray.io", "v1", ns, "rayclusters", "rc", {"spec": {}},
            _content_type="application/strategic-merge-patch+json",
        )  # fmt: skip
    status = status_of(exc)
    assert (exc.value.status, status["reason"], status["message"]) == (
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
    )


def test_get_and_put_on_resize(core, ns):
    running_pod(core, ns, "p", **BURSTABLE)
    via_resize = core.read_namespaced_pod_resize("p", ns)
    assert via_resize.to_dict() == core.read_namespaced_pod("p", ns).to_dict()
    via_resize.spec.containers[0].resources.requests["cpu"] = "110m"
    replaced = core.replace_namespaced_pod_resize("p", ns, via_resize)
    assert replaced.spec.containers[0].resources.requests["cpu"] == "110m"


def test_stale_resource_version_conflicts(core, ns):
    pod = running_pod(core, ns, "p", **BURSTABLE)
    core.patch_namespaced_pod("p", ns, {"metadata": {"labels": {"touched": "yes"}}})
    pod.spec.containers[0].resources.requests["cpu"] = "110m"
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_pod_resize("p", ns, pod)
    assert exc.value.status == 409
    body = status_of(exc)
    assert body["reason"] == "Conflict"
    assert body["message"] == (
        'Operation cannot be fulfilled on pods "p": the object has been modified; please apply '
        "your changes to the latest version and try again"
    )


def test_resource_version_in_a_merge_patch_is_a_precondition(core, ns):
    pod = running_pod(core, ns, "p", **BURSTABLE)
    core.patch_namespaced_pod("p", ns, {"metadata": {"annotations": {"a": "1"}}})
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod(
            "p",
            ns,
            {
                "metadata": {
                    "resourceVersion": pod.metadata.resource_version,
                    "annotations": {"a": "2"},
                }
            },
            _content_type="application/merge-patch+json",
        )
    assert exc.value.status == 409


STALE = (
    'Operation cannot be fulfilled on pods "p": the object has been modified; please apply '
    "your changes to the latest version and try again"
)


def test_put_on_the_pod_changes_what_an_update_may_and_refuses_a_stale_version(core, ns):
    pod = parked_pod(core, ns, pod_body("p", **BURSTABLE))
    edited = core.read_namespaced_pod("p", ns)
    edited.metadata.labels["edited"] = "yes"
    edited.spec.containers[0].image = "registry.k8s.io/pause:3.9"
    edited.spec.active_deadline_seconds = 600
    replaced = core.replace_namespaced_pod("p", ns, edited)
    assert replaced.metadata.labels == {"app": "conformance", "edited": "yes"}
    assert replaced.spec.containers[0].image == "registry.k8s.io/pause:3.9"
    assert replaced.spec.active_deadline_seconds == 600
    assert replaced.spec.containers[0].resources.requests == BURSTABLE["requests"]
    assert replaced.metadata.generation == pod.metadata.generation + 1
    assert replaced.metadata.resource_version != pod.metadata.resource_version
    edited.metadata.labels["again"] = "yes"  # still at the version read before the update
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_pod("p", ns, edited)
    status = status_of(exc)
    assert (exc.value.status, status["reason"], status["message"]) == (409, "Conflict", STALE)
    assert "again" not in core.read_namespaced_pod("p", ns).metadata.labels


def test_status_writes_change_the_status_and_never_the_spec(core, ns):
    pod = parked_pod(core, ns, pod_body("p", **BURSTABLE))
    patched = core.patch_namespaced_pod_status(
        "p",
        ns,
        {
            "metadata": {"labels": {"via": "status"}},
            "spec": {
                "activeDeadlineSeconds": 60,
                "containers": [{"name": "c0", "resources": {"requests": {"cpu": "150m"}}}],
            },
            "status": {"conditions": [{"type": "raysize.test/Checked", "status": "True"}]},
        },
    )
    assert conditions(patched)["raysize.test/Checked"].status == "True"
    assert patched.spec.active_deadline_seconds is None
    assert patched.spec.containers[0].resources.requests["cpu"] == "100m"
    assert patched.metadata.generation == pod.metadata.generation
    # podStatusStrategy resets only spec, deletionTimestamp and ownerReferences: labels
    # sent to /status are kept (the NodeRestriction admission is what stops kubelets).
    assert patched.metadata.labels["via"] == "status"

    current = core.read_namespaced_pod("p", ns)
    current.status.conditions = [client.V1PodCondition(type="raysize.test/Checked", status="False")]
    current.spec.containers[0].image = "registry.k8s.io/pause:3.9"
    replaced = core.replace_namespaced_pod_status("p", ns, current)
    assert conditions(replaced)["raysize.test/Checked"].status == "False"
    assert replaced.spec.containers[0].image == PAUSE_IMAGE
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_pod_status("p", ns, current)  # the version before the PUT
    assert (exc.value.status, status_of(exc)["message"]) == (409, STALE)

    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod_status("p", ns, {"status": {"qosClass": "Guaranteed"}})
    assert (exc.value.status, status_of(exc)["message"]) == (
        422,
        'Pod "p" is invalid: status.qosClass: Invalid value: "Guaranteed": field is immutable',
    )


def test_delete_preconditions_that_do_not_match_conflict(core, ns):
    pod = parked_pod(core, ns, pod_body("p", **BURSTABLE))
    other_uid = "00000000-0000-0000-0000-000000000000"
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_pod(
            "p",
            ns,
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=other_uid)),
        )
    status = status_of(exc)
    assert (exc.value.status, status["reason"]) == (409, "Conflict")
    assert status["message"] == (
        f'Operation cannot be fulfilled on Pod "p": the UID in the precondition ({other_uid}) '
        f"does not match the UID in record ({pod.metadata.uid}). The object might have been "
        "deleted and then recreated"
    )
    assert status["details"] == {"name": "p", "kind": "Pod"}

    touched = core.patch_namespaced_pod("p", ns, {"metadata": {"labels": {"touched": "yes"}}})
    stale = pod.metadata.resource_version
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_pod(
            "p",
            ns,
            body=client.V1DeleteOptions(
                preconditions=client.V1Preconditions(uid=pod.metadata.uid, resource_version=stale)
            ),
        )
    assert (exc.value.status, status_of(exc)["message"]) == (
        409,
        f'Operation cannot be fulfilled on Pod "p": the ResourceVersion in the precondition '
        f"({stale}) does not match the ResourceVersion in record "
        f"({touched.metadata.resource_version}). The object might have been modified",
    )
    assert core.read_namespaced_pod("p", ns).metadata.uid == pod.metadata.uid  # not deleted

    core.delete_namespaced_pod(
        "p",
        ns,
        body=client.V1DeleteOptions(
            grace_period_seconds=0,
            preconditions=client.V1Preconditions(
                uid=pod.metadata.uid, resource_version=touched.metadata.resource_version
            ),
        ),
    )

    def gone() -> bool:
        try:
            core.read_namespaced_pod("p", ns)
        except ApiException as e:
            return e.status == 404
        return False

    wait_for(gone)


OTHER_UID = "00000000-0000-0000-0000-000000000000"


def uid_is_immutable(name: str, uid: str, kind: str = "Pod") -> dict[str, Any]:
    """A patch whose body names another UID: not a precondition (that is a PUT's), a
    change of an immutable field, checked twice (the common metadata checks and the
    kind's own), so its cause comes twice and its message once."""
    cause = {
        "reason": "FieldValueInvalid",
        "message": f'Invalid value: "{uid}": field is immutable',
        "field": "metadata.uid",
    }
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'{kind} "{name}" is invalid: metadata.uid: Invalid value: "{uid}": '
        "field is immutable",
        "reason": "Invalid",
        "details": {"name": name, "kind": kind, "causes": [cause, cause]},
        "code": 422,
    }


def test_a_uid_in_a_patch_body_is_refused_as_immutable(core, ns):
    """How a write names the pod it was decided on: a patch carrying another pod's UID
    changes nothing, on the pod, pods/status and pods/resize alike, and a patch carrying
    the pod's own UID goes through."""
    pod = parked_pod(core, ns, pod_body("p", **BURSTABLE))
    merge = "application/merge-patch+json"
    other = {"uid": OTHER_UID}
    writes = {
        "pod": lambda meta: core.patch_namespaced_pod(
            "p", ns, {"metadata": {**meta, "annotations": {"a": "1"}}}, _content_type=merge
        ),
        "status": lambda meta: core.patch_namespaced_pod_status(
            "p", ns, {"metadata": meta, "status": {"conditions": [
                {"type": "raysize.test/Checked", "status": "True"}]}}, _content_type=merge,
        ),
        "resize": lambda meta: resize(core, ns, "p", {"metadata": meta, "spec": {"containers": [
            {"name": "c0", "resources": {"requests": {"cpu": "150m"}}}]}}),
    }  # fmt: skip
    for what, write in writes.items():
        with pytest.raises(ApiException) as exc:
            write(other)
        assert (what, exc.value.status, status_of(exc)) == (
            what,
            422,
            uid_is_immutable("p", OTHER_UID),
        )
    # with the kind's own errors: the UID's come first
    with pytest.raises(ApiException) as exc:
        resize(
            core,
            ns,
            "p",
            {
                "metadata": other,
                "spec": {
                    "containers": [{"name": "c0", "resources": {"requests": {"cpu": "300m"}}}]
                },
            },
        )  # above its limit
    too_much = {
        "reason": "FieldValueInvalid",
        "message": 'Invalid value: "300m": must be less than or equal to cpu limit of 200m',
        "field": "spec.containers[0].resources.requests",
    }  # fmt: skip
    expected = uid_is_immutable("p", OTHER_UID)
    expected["message"] = (
        f'Pod "p" is invalid: [metadata.uid: Invalid value: "{OTHER_UID}": field is immutable, '
        f"spec.containers[0].resources.requests: {too_much['message']}]"
    )
    expected["details"]["causes"].append(too_much)
    assert status_of(exc) == expected
    after = core.read_namespaced_pod("p", ns)
    assert after.metadata.resource_version == pod.metadata.resource_version  # nothing written
    for write in writes.values():
        write({"uid": pod.metadata.uid})
    after = core.read_namespaced_pod("p", ns)
    assert after.metadata.annotations == {"a": "1"}
    assert after.spec.containers[0].resources.requests["cpu"] == "150m"
    assert conditions(after)["raysize.test/Checked"].status == "True"
    assert after.metadata.uid == pod.metadata.uid


def test_a_json_patch_test_of_the_uid_guards_a_resize(core, ns):
    """The resize subresource takes a JSON patch whose first op tests the UID: another
    pod's UID fails the whole patch (a bare 422, no cause), the pod's own applies it."""
    pod = parked_pod(core, ns, pod_body("p", **BURSTABLE))
    grow = {"op": "replace", "path": "/spec/containers/0/resources/requests/cpu", "value": "150m"}
    with pytest.raises(ApiException) as exc:
        resize(core, ns, "p", [{"op": "test", "path": "/metadata/uid", "value": OTHER_UID}, grow])
    assert (exc.value.status, status_of(exc)) == (
        422,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "the server rejected our request due to an error in our request",
            "reason": "Invalid",
            "details": {},
            "code": 422,
        },
    )
    assert core.read_namespaced_pod("p", ns).metadata.generation == pod.metadata.generation
    test = {"op": "test", "path": "/metadata/uid", "value": pod.metadata.uid}
    grown = resize(core, ns, "p", [test, grow])
    assert grown.spec.containers[0].resources.requests["cpu"] == "150m"
    assert grown.metadata.generation == pod.metadata.generation + 1


def test_a_uid_in_a_put_is_a_precondition(core, ns):
    """A PUT (of the pod or of pods/resize) naming another UID is a failed precondition:
    409, in the storage layer's words, before the resourceVersion is looked at."""
    pod = parked_pod(core, ns, pod_body("p", **BURSTABLE))
    edited = core.read_namespaced_pod("p", ns)
    edited.metadata.uid = OTHER_UID
    edited.metadata.labels["edited"] = "yes"
    edited.spec.containers[0].resources.requests["cpu"] = "150m"
    expected = (
        409,
        "Conflict",
        'Operation cannot be fulfilled on pods "p": StorageError: invalid object, Code: 4, '
        f"Key: /registry/pods/{ns}/p, ResourceVersion: 0, AdditionalErrorMsg: Precondition "
        f"failed: UID in precondition: {OTHER_UID}, UID in object meta: {pod.metadata.uid}",
        {"name": "p", "kind": "pods"},
    )
    for put in (core.replace_namespaced_pod, core.replace_namespaced_pod_resize):
        with pytest.raises(ApiException) as exc:
            put("p", ns, edited)
        body = status_of(exc)
        assert (exc.value.status, body["reason"], body["message"], body["details"]) == expected
    edited.metadata.resource_version = "1"  # stale as well: the UID is checked first
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_pod("p", ns, edited)
    assert status_of(exc)["message"] == expected[2]
    after = core.read_namespaced_pod("p", ns)
    assert after.metadata.resource_version == pod.metadata.resource_version


def test_missing_pod_is_not_found(core, ns):
    with pytest.raises(ApiException) as exc:
        resize(core, ns, "nope", {"spec": {}})
    body = status_of(exc)
    assert (exc.value.status, body["reason"], body["message"]) == (
        404,
        "NotFound",
        'pods "nope" not found',
    )
    assert body["details"] == {"name": "nope", "kind": "pods"}


def test_resources_cannot_change_through_a_plain_pod_update(core, ns):
    running_pod(core, ns, "p", **BURSTABLE)
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod(
            "p",
            ns,
            {"spec": {"containers": [{"name": "c0", "resources": {"requests": {"cpu": "150m"}}}]}},
        )
    body = status_of(exc)
    assert (exc.value.status, body["reason"]) == (422, "Invalid")
    # docs/design/kubernetes-resize.md §1: what follows "other than " (the list of updatable fields and a
    # diff) varies by version, so only this prefix and the single cause are pinned.
    assert body["message"].startswith(
        'Pod "p" is invalid: spec: Forbidden: pod updates may not change fields other than '
    )
    [cause] = body["details"]["causes"]
    assert (cause["field"], cause["reason"]) == ("spec", "FieldValueForbidden")
    assert cause["message"].startswith("Forbidden: pod updates may not change fields other than ")
    assert core.read_namespaced_pod("p", ns).spec.containers[0].resources.requests["cpu"] == "100m"


def test_a_resize_that_changes_nothing_writes_nothing(core, ns):
    """The pod is parked on a node no kubelet runs, so nothing but this test writes to it:
    an unchanged resourceVersion then means the server wrote nothing (on a running pod a
    kubelet status write could move it, and the comparison would prove nothing)."""
    pod = parked_pod(core, ns, pod_body("p", **BURSTABLE))
    again = resize(
        core,
        ns,
        "p",
        {"spec": {"containers": [{"name": "c0", "resources": {"requests": {"cpu": "100m"}}}]}},
    )
    assert again.metadata.generation == pod.metadata.generation
    assert again.spec.to_dict() == pod.spec.to_dict()
    assert again.metadata.resource_version == pod.metadata.resource_version


def test_resize_cannot_change_labels_or_status(core, ns):
    running_pod(core, ns, "p", **BURSTABLE)
    pod = resize(
        core,
        ns,
        "p",
        {
            "metadata": {"labels": {"x": "y"}},
            "status": {"phase": "Failed"},
            "spec": {"containers": [{"name": "c0", "resources": {"requests": {"cpu": "110m"}}}]},
        },
    )
    assert "x" not in pod.metadata.labels
    assert pod.status.phase == "Running"


# --- §2: what the kubelet reports ---------------------------------------------------------
def test_accepted_resize_is_actuated_and_reported(core, ns, tracked, keeps_allocated):
    running_pod(core, ns, "p", **BURSTABLE)
    patched = resize(
        core,
        ns,
        "p",
        {
            "spec": {
                "containers": [
                    {
                        "name": "c0",
                        "resources": {"requests": {"cpu": "150m"}, "limits": {"cpu": "250m"}},
                    }
                ]
            }
        },
    )

    def done() -> client.V1Pod | None:
        pod = core.read_namespaced_pod("p", ns)
        cs = pod.status.container_statuses[0]
        finished = (
            cs.resources.requests["cpu"] == "150m"
            and cs.resources.limits["cpu"] == "250m"
            and not {"PodResizePending", "PodResizeInProgress"} & set(conditions(pod))
        )
        return pod if finished else None

    pod = wait_for(done, timeout=60)
    if keeps_allocated:
        assert pod.status.container_statuses[0].allocated_resources["cpu"] == "150m"
    assert pod.status.observed_generation == tracked(patched.metadata.generation)
    reasons = wait_for(
        lambda: (
            {
                e.reason
                for e in core.list_namespaced_event(
                    ns, field_selector="involvedObject.name=p"
                ).items
            }
            >= {"ResizeStarted", "ResizeCompleted"}
            and {
                e.reason: e
                for e in core.list_namespaced_event(
                    ns, field_selector="involvedObject.name=p"
                ).items
            }
        ),
        timeout=30,
    )
    assert reasons["ResizeStarted"].type == "Normal"
    assert reasons["ResizeStarted"].message.startswith("Pod resize started: {")
    assert json.loads(reasons["ResizeCompleted"].message.split(": ", 1)[1])["generation"] == (
        patched.metadata.generation
    )


def test_infeasible_resize_is_refused_at_admission_from_1_36_else_pending(
    core, ns, server_minor, tracked
):
    """A resize above the node's allocatable: 1.36's admission refuses it (403, cause
    NodeCapacity, the pod unchanged); 1.33-1.35 store it and the kubelet marks it
    Infeasible with its own message and a Warning event."""
    pod = running_pod(core, ns, "p", requests={"cpu": "100m", "memory": "64Mi"})
    node = core.read_node(pod.spec.node_name)
    capacity = node.status.allocatable["cpu"]
    cap_m = quantity_to_units(capacity, CPU)
    patch = {
        "spec": {
            "containers": [{"name": "c0", "resources": {"requests": {"cpu": f"{cap_m + 1000}m"}}}]
        }
    }
    if server_minor >= 36:
        with pytest.raises(ApiException) as exc:
            resize(core, ns, "p", patch)
        status = status_of(exc)
        assert (exc.value.status, status["reason"]) == (403, "Forbidden")
        assert status["message"] == (
            'pods "p" is forbidden: node didn\'t have enough allocatable resources: cpu, '
            f"requested: {cap_m + 1000}, allocatable: {cap_m}"
        )
        assert status["details"]["causes"] == [{"reason": "NodeCapacity"}]
        after = core.read_namespaced_pod("p", ns)
        assert after.spec.containers[0].resources.requests["cpu"] == "100m"
        assert after.metadata.generation == pod.metadata.generation
        return
    patched = resize(core, ns, "p", patch)

    def pending() -> client.V1PodCondition | None:
        return conditions(core.read_namespaced_pod("p", ns)).get("PodResizePending")

    cond = wait_for(pending, timeout=30)
    assert (cond.status, cond.reason) == ("True", "Infeasible")
    assert cond.message == (
        f"Node didn't have enough capacity: cpu, requested: {cap_m + 1000}, capacity: {cap_m}"
    )
    assert cond.observed_generation == tracked(patched.metadata.generation)
    event = wait_for(
        lambda: [
            e
            for e in core.list_namespaced_event(ns, field_selector="involvedObject.name=p").items
            if e.reason == "ResizeInfeasible"
        ]
    )[0]
    assert event.type == "Warning"
    assert event.message.startswith("Pod resize Infeasible: ")
    assert json.loads(event.message.split(": ", 1)[1])["error"] == cond.message


# --- patch types, selectors, watch, events ------------------------------------------------
def test_strategic_merge_patch_merges_containers_by_name(core, ns):
    core.create_namespaced_pod(ns, pod_body("p", containers=2, **BURSTABLE))
    pod = core.patch_namespaced_pod(
        "p", ns, {"spec": {"containers": [{"name": "c1", "image": "registry.k8s.io/pause:3.9"}]}}
    )
    assert [c.image for c in pod.spec.containers] == [
        "registry.k8s.io/pause:3.10",
        "registry.k8s.io/pause:3.9",
    ]


def test_json_patch_test_operation_guards_a_write(core, ns):
    core.create_namespaced_pod(ns, pod_body("p", **BURSTABLE))
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod(
            "p",
            ns,
            [
                {"op": "test", "path": "/metadata/labels/app", "value": "other"},
                {"op": "replace", "path": "/metadata/labels/app", "value": "new"},
            ],
        )
    assert exc.value.status == 422
    assert status_of(exc) == {  # no cause: the real server names none
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "the server rejected our request due to an error in our request",
        "reason": "Invalid",
        "details": {},
        "code": 422,
    }
    assert core.read_namespaced_pod("p", ns).metadata.labels["app"] == "conformance"


def test_label_and_field_selectors(core, ns):
    for name, tier in (("a", "web"), ("b", "db"), ("c", "web")):
        core.create_namespaced_pod(
            ns, pod_body(name, labels={"tier": tier, "app": "sel"}, **BURSTABLE)
        )
    names = lambda **kw: sorted(p.metadata.name for p in core.list_namespaced_pod(ns, **kw).items)  # noqa: E731
    assert names(label_selector="tier=web") == ["a", "c"]
    assert names(label_selector="tier!=web") == ["b"]
    assert names(label_selector="tier in (db,cache)") == ["b"]
    assert names(label_selector="tier notin (db),app=sel") == ["a", "c"]
    assert names(label_selector="!tier") == []
    assert names(field_selector="metadata.name=b") == ["b"]
    assert names(field_selector="metadata.name!=b,metadata.namespace=" + ns) == ["a", "c"]
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_pod(ns, field_selector="spec.bogus=1")
    assert exc.value.status == 400


def test_list_limit_and_continue(core, ns):
    for i in range(5):
        core.create_namespaced_pod(ns, pod_body(f"p{i}", **BURSTABLE))
    first = core.list_namespaced_pod(ns, limit=2)
    assert len(first.items) == 2 and first.metadata._continue
    rest = core.list_namespaced_pod(ns, limit=10, _continue=first.metadata._continue)
    assert len(first.items) + len(rest.items) == 5


def test_a_list_continued_after_a_change_misses_nothing(core, ns):
    """Pages continue after the last object sent, so a pod of an earlier page deleted
    between two pages shifts nothing (with an offset, the next page skipped one), and
    every page says the first one's resourceVersion: a watch from it replays the rest.
    A token that is not one of the server's is refused."""
    for i in range(6):
        core.create_namespaced_pod(ns, pod_body(f"p{i}", **BURSTABLE))
    first = core.list_namespaced_pod(ns, limit=3)
    assert [p.metadata.name for p in first.items] == ["p0", "p1", "p2"]
    core.delete_namespaced_pod("p0", ns, grace_period_seconds=0)
    core.create_namespaced_pod(ns, pod_body("p9", **BURSTABLE))
    rest = core.list_namespaced_pod(ns, limit=10, _continue=first.metadata._continue)
    names = [p.metadata.name for p in rest.items]
    assert names[:3] == ["p3", "p4", "p5"]
    assert rest.metadata.resource_version == first.metadata.resource_version
    assert not rest.metadata._continue
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_pod(ns, limit=2, _continue="not-a-token")
    assert exc.value.status == 400


def test_watch_sees_every_change_in_order_and_resumes(core, ns):
    start_rv = core.list_namespaced_pod(ns).metadata.resource_version
    seen: list[tuple[str, str]] = []
    w = watch.Watch()
    done = threading.Event()

    def consume() -> None:
        for event in w.stream(
            core.list_namespaced_pod,
            ns,
            resource_version=start_rv,
            label_selector="app=conformance",
            timeout_seconds=30,
        ):
            seen.append((event["type"], event["object"].metadata.name))
            if event["type"] == "DELETED":
                break
        done.set()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    core.create_namespaced_pod(ns, pod_body("w", **BURSTABLE))
    core.patch_namespaced_pod("w", ns, {"metadata": {"annotations": {"k": "v"}}})
    core.delete_namespaced_pod("w", ns, grace_period_seconds=0)
    assert done.wait(30)
    w.stop()
    assert seen[0] == ("ADDED", "w")
    assert seen[-1] == ("DELETED", "w")
    assert all(kind == "MODIFIED" for kind, _ in seen[1:-1])
    # Resuming from the first event's revision replays what came after it.
    replay = core.list_namespaced_pod(
        ns, watch=True, resource_version=start_rv, timeout_seconds=1, _preload_content=False
    )
    kinds = [json.loads(line)["type"] for line in replay.read().splitlines() if line]
    assert kinds[0] == "ADDED" and kinds[-1] == "DELETED"


def test_a_watch_from_before_the_servers_window_replays_what_it_holds(core, ns, server_minor):
    """The real server's watch cache holds every event since it started (until its window
    fills): a watch from resourceVersion 1 replays them, it is not 410 Gone. (A watch from
    before a full window is; tests/sandbox/test_store.py shows that on the sandbox, whose
    window can be made small.) 1.33's is: its window starts after resourceVersion 1."""
    parked_pod(core, ns, pod_body("w", **BURSTABLE))
    core.patch_namespaced_pod("w", ns, {"metadata": {"labels": {"seen": "yes"}}})
    response = core.list_namespaced_pod(
        ns, watch=True, resource_version="1", timeout_seconds=2, _preload_content=False
    )
    assert response.status == 200
    events = [json.loads(line) for line in response.read().splitlines() if line]
    if server_minor <= 33:
        assert [(e["type"], e["object"]["code"]) for e in events] == [("ERROR", 410)], events
        return
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED"], events
    assert events[1]["object"]["metadata"]["labels"]["seen"] == "yes"


def test_events_create_and_list_by_involved_object(core, ns):
    core.create_namespaced_pod(ns, pod_body("p", **BURSTABLE))
    pod = core.read_namespaced_pod("p", ns)
    core.create_namespaced_event(
        ns,
        {
            "metadata": {"name": "p.custom"},
            "involvedObject": {
                "kind": "Pod",
                "name": "p",
                "namespace": ns,
                "uid": pod.metadata.uid,
            },
            "reason": "Tested",
            "message": "hello",
            "type": "Normal",
            "source": {"component": "raysize"},
        },
    )
    events = core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name=p,involvedObject.uid={pod.metadata.uid}"
    )
    assert "Tested" in [e.reason for e in events.items]


def test_raycluster_crud_status_subresource_and_generation(kube, ns):
    if os.environ.get("RAYSIZE_TEST_KUBECONFIG"):  # the sandbox always serves RayClusters
        served = {
            v.group_version
            for g in client.ApisApi(kube).get_api_versions().groups
            for v in g.versions
        }
        if "ray.io/v1" not in served:
            pytest.skip("the cluster serves no ray.io/v1 (RayCluster CRD not installed)")
    co = client.CustomObjectsApi(kube)
    rc = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "rc"},
        "spec": {
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {
                    "spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.60.0"}]}
                },
            },
            "workerGroupSpecs": [],
        },
    }
    created = co.create_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", rc)
    assert created["metadata"]["generation"] == 1
    patched = co.patch_namespaced_custom_object(
        "ray.io",
        "v1",
        ns,
        "rayclusters",
        "rc",
        {"metadata": {"annotations": {"a": "1"}}, "status": {"state": "bogus"}},
    )
    assert patched["metadata"]["generation"] == 1  # metadata only: no new generation
    assert (patched.get("status") or {}).get("state") != "bogus"  # status via /status only
    patched = co.patch_namespaced_custom_object(
        "ray.io", "v1", ns, "rayclusters", "rc", {"spec": {"rayVersion": "2.60.0"}}
    )
    assert patched["metadata"]["generation"] == 2
    status = co.patch_namespaced_custom_object_status(
        "ray.io",
        "v1",
        ns,
        "rayclusters",
        "rc",
        {"status": {"state": "custom"}, "spec": {"rayVersion": "9"}},
    )
    assert status["status"]["state"] == "custom" and status["spec"]["rayVersion"] == "2.60.0"
    listed = co.list_namespaced_custom_object("ray.io", "v1", ns, "rayclusters")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["rc"]
    with pytest.raises(ApiException) as exc:
        co.create_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", rc)
    assert exc.value.status == 409 and json.loads(exc.value.body)["reason"] == "AlreadyExists"
    co.delete_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", "rc")
    with pytest.raises(ApiException) as exc:
        co.get_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", "rc")
    assert json.loads(exc.value.body)["message"] == 'rayclusters.ray.io "rc" not found'


# --- where the sandbox used to differ from the real server (both worlds now agree) ---------
def small_raycluster(name: str = "rc") -> dict[str, Any]:
    """A RayCluster created without `scaleStrategy`, as most are."""
    template = {"spec": {"containers": [{"name": "ray", "image": "rayproject/ray:2.60.0"}]}}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name},
        "spec": {
            "headGroupSpec": {"rayStartParams": {}, "template": template},
            "workerGroupSpecs": [
                {
                    "groupName": "g",
                    "replicas": 0,
                    "minReplicas": 0,
                    "maxReplicas": 2,
                    "rayStartParams": {},
                    "template": template,
                }
            ],
        },
    }


def test_a_json_patch_replace_of_a_missing_member_is_applied(kube, ns):
    """json-patch v4 leniency, which Ray's own KubeRay provider relies on to scale in."""
    co = client.CustomObjectsApi(kube)
    co.create_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", small_raycluster())
    patched = co.patch_namespaced_custom_object(
        "ray.io", "v1", ns, "rayclusters", "rc",
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/scaleStrategy",
          "value": {"workersToDelete": ["w1"]}}],
        _content_type="application/json-patch+json",
    )  # fmt: skip
    assert patched["spec"]["workerGroupSpecs"][0]["scaleStrategy"] == {"workersToDelete": ["w1"]}


def test_the_raycluster_schema_is_enforced(kube, ns):
    """The CRD's schema refuses a mistyped field (the sandbox used to store it)."""
    co = client.CustomObjectsApi(kube)
    body = small_raycluster()
    body["spec"]["workerGroupSpecs"][0]["replicas"] = "two"
    with pytest.raises(ApiException) as exc:
        co.create_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", body)
    status = status_of(exc)
    assert (exc.value.status, status["reason"]) == (422, "Invalid")
    assert status["message"].startswith(
        'RayCluster.ray.io "rc" is invalid: [spec.workerGroupSpecs[0].replicas: Invalid value: '
        '"string": spec.workerGroupSpecs[0].replicas in body must be of type integer: "string"'
    )
    assert status["details"]["causes"][0] == {
        "reason": "FieldValueTypeInvalid",
        "message": 'Invalid value: "string": spec.workerGroupSpecs[0].replicas in body must be '
        'of type integer: "string"',
        "field": "spec.workerGroupSpecs[0].replicas",
    }


def test_a_quantity_sent_as_a_json_number_is_stored_canonical(core, ns):
    parked_pod(core, ns, pod_body("p", **BURSTABLE))
    pod = resize(
        core, ns, "p",
        {"spec": {"containers": [{"name": "c0", "resources": {
            "requests": {"cpu": 0.15}, "limits": {"cpu": 0.5, "memory": 268435456}}}]}},
    )  # fmt: skip
    resources = pod.spec.containers[0].resources
    assert (resources.requests["cpu"], resources.limits) == (
        "150m",
        {"cpu": "500m", "memory": "268435456"},
    )


def test_a_dry_run_resize_is_answered_and_changes_nothing(core, ns):
    pod = parked_pod(core, ns, pod_body("p", **BURSTABLE))
    answer = resize(
        core, ns, "p",
        {"spec": {"containers": [{"name": "c0", "resources": {"requests": {"cpu": "150m"}}}]}},
        dry_run="All",
    )  # fmt: skip
    assert answer.spec.containers[0].resources.requests["cpu"] == "150m"
    after = core.read_namespaced_pod("p", ns)
    assert after.spec.containers[0].resources.requests["cpu"] == "100m"
    assert after.metadata.resource_version == pod.metadata.resource_version


def test_a_bad_quantity_in_a_resize_patch_is_invalid_on_the_patch(core, ns):
    parked_pod(core, ns, pod_body("p", **BURSTABLE))
    with pytest.raises(ApiException) as exc:
        resize(
            core, ns, "p",
            {"spec": {"containers": [{"name": "c0", "resources": {"limits": {"cpu": "lots"}}}]}},
        )  # fmt: skip
    status = status_of(exc)
    quoted = "map[spec:map[containers:[map[name:c0 resources:map[limits:map[cpu:lots]]]]]]"
    rule = (
        "quantities must match the regular expression "
        "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )
    assert (exc.value.status, status["reason"], status["message"]) == (
        422,
        "Invalid",
        f' "" is invalid: patch: Invalid value: "{quoted}": {rule}',
    )
    assert status["details"]["causes"] == [
        {"reason": "FieldValueInvalid", "message": f'Invalid value: "{quoted}": {rule}',
         "field": "patch"}
    ]  # fmt: skip


def test_an_event_about_an_object_of_another_namespace_is_refused(core, ns):
    core.create_namespaced_pod(ns, pod_body("p", **BURSTABLE))
    event = {
        "metadata": {"name": "e1"},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "other"},
        "reason": "Test",
        "message": "m",
        "type": "Normal",
    }
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_event(ns, event)
    assert (exc.value.status, status_of(exc)["message"]) == (
        422,
        'Event "e1" is invalid: involvedObject.namespace: Invalid value: "other": does not '
        "match event.namespace",
    )
    event["involvedObject"]["namespace"] = ns
    assert core.create_namespaced_event(ns, event).involved_object.namespace == ns


def test_a_watch_with_bookmarks_says_how_far_it_got(core, ns):
    """With allowWatchBookmarks the server sends BOOKMARKs (the sandbox sent none): the
    revision a client may resume from without a relist."""
    start = core.list_namespaced_pod(ns).metadata.resource_version
    core.create_namespaced_pod(ns, pod_body("w", **BURSTABLE))
    response = core.list_namespaced_pod(
        ns, watch=True, resource_version=start, allow_watch_bookmarks=True,
        timeout_seconds=5, _preload_content=False,
    )  # fmt: skip
    events = [json.loads(line) for line in response.read().splitlines() if line]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "ADDED" and "BOOKMARK" in kinds, kinds
    mark = next(e["object"] for e in events if e["type"] == "BOOKMARK")
    assert (mark["kind"], mark["apiVersion"]) == ("Pod", "v1")
    assert int(mark["metadata"]["resourceVersion"]) >= int(
        events[0]["object"]["metadata"]["resourceVersion"]
    )
