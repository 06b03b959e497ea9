"""The kubelet's PodResizePending messages (and Kubernetes 1.36's admission refusal): how
much a pod may still request on its node, read from the words Kubernetes uses."""

from __future__ import annotations

import re

from raysize.workflows.values import Value

_DEFERRED_RE = re.compile(
    r"Node didn't have enough resource: (cpu|memory), requested: (\d+), used: (\d+), "
    r"capacity: (\d+)"
)
_INFEASIBLE_RE = re.compile(
    r"Node didn't have enough capacity: (cpu|memory), requested: (\d+), capacity: (\d+)"
    # Kubernetes 1.36+ says the same at admission (403, cause NodeCapacity)
    r"|node didn't have enough allocatable resources: (cpu|memory), requested: (\d+), "
    r"allocatable: (\d+)"
)


class KubeletReport(Value):
    """What a Deferred/Infeasible message says the pod may still request on its node."""

    resource: str  # "cpu" | "memory"
    max_request: int  # millicores or bytes the pod's requests may total


def parse_kubelet_message(reason: str, message: str | None) -> KubeletReport | None:
    """Parse the kubelet's PodResizePending message; None when it carries no numbers."""
    if not message:
        return None
    if reason == "Deferred":
        m = _DEFERRED_RE.search(message)
        if m:
            return KubeletReport(resource=m.group(1), max_request=int(m.group(4)) - int(m.group(3)))
    elif reason == "Infeasible":
        m = _INFEASIBLE_RE.search(message)
        if m:
            resource, _, capacity = m.group(1, 2, 3) if m.group(1) else m.group(4, 5, 6)
            return KubeletReport(resource=resource, max_request=int(capacity))
    return None
