"""The `raysize-launch-size` MutatingAdmissionPolicy (deploy/components/launch-size) as the
embedded server applies it: it evaluates no CEL, so it does what that policy's expressions
do, on every pod it is asked to create.

A worker pod KubeRay creates (labels `ray.io/node-type: worker`, `ray.io/cluster`,
`ray.io/group`, `app.kubernetes.io/created-by: kuberay-operator`) whose namespace has the
ConfigMap `raysize-launch-sizes` with keys `<cluster>.<group>.<requests|limits>.<cpu|memory>`
gets those quantities on its first container; any other pod, or no ConfigMap or key, is
left as it is. The real world runs the policy itself (deploy/ installs it); the two are
held equal by tests/sandbox/test_launch_size.py, which runs in both worlds.

The embedded world behaves as a cluster with deploy/ applied: the policy is always on
(docs/design/test-worlds.md)."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

CONFIGMAP = "raysize-launch-sizes"
_FIELDS = (("requests", "cpu"), ("requests", "memory"), ("limits", "cpu"), ("limits", "memory"))


def admit(pod: Obj, configmap: Obj | None) -> None:
    """Mutate `pod` (being created) as the policy would, given its namespace's ConfigMap."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    containers = (pod.get("spec") or {}).get("containers") or []
    if (
        labels.get("ray.io/node-type") != "worker"
        or labels.get("app.kubernetes.io/created-by") != "kuberay-operator"
        or "ray.io/cluster" not in labels
        or "ray.io/group" not in labels
        or not containers
        or configmap is None
    ):
        return
    data = configmap.get("data") or {}
    key = f"{labels['ray.io/cluster']}.{labels['ray.io/group']}"
    for kind, resource in _FIELDS:
        value = data.get(f"{key}.{kind}.{resource}")
        if value is None:
            continue
        res = containers[0].setdefault("resources", {})
        res.setdefault(kind, {})[resource] = value
