"""Karpenter in the real test world: the real node autoscaler (`sigs.k8s.io/karpenter`,
its kwok cloud provider, built from its Go module by scripts/build_control_plane.sh),
for the tests that need nodes made on demand.

Karpenter's kwok provider "launches" an instance by creating its Node (tainted
`karpenter.sh/unregistered`, sized as the instance type's allocatable); in Karpenter's
own tests kwok then fakes that Node's kubelet. Here the kubelet simulator does
(`Kubelet(adopts=made_by_karpenter)`): it posts the Node's status (Ready, with the
capacity and allocatable Karpenter gave it) and runs the pods bound to it. Karpenter does
the rest as in a cluster: it registers the Node (lifting its `unregistered` taint),
initializes it once Ready, and kube-scheduler binds the pod that was waiting to it.

`RealControlPlane.start_karpenter()` starts it (once: later calls return the running
one), and `close()` stops it by its process group with the other parts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]

# the marks of a Node made by the kwok provider (on its labels and annotations): what
# kwok's own controller selects the nodes it fakes by, and the kubelet simulator too
KWOK_NODE_KEY = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"
KWOK_API_GROUP = "karpenter.kwok.sh"
NODE_CLASS = "default"  # the KWOKNodeClass our NodePools use
ZONE = "test-zone-a"
# the batch windows: how long Karpenter gathers pending pods before it decides on nodes
# (defaults 1 s idle, 10 s at most). Short here: a test waits on one pod, not a burst
BATCH_IDLE_DURATION = "100ms"
BATCH_MAX_DURATION = "1s"


@dataclass(frozen=True)
class InstanceType:
    """An instance type of the kwok provider: `cpu` cores and `memory_gi` GiB, on demand
    in one zone, priced as Karpenter's own generator prices its generic types (so the
    cheapest that fits is the smallest)."""

    name: str
    cpu: int
    memory_gi: int
    pods: int = 110

    @property
    def price(self) -> float:
        return 0.025 * self.cpu + 0.001 * self.memory_gi * 1024**3 / 1e9

    def as_kwok(self) -> Obj:
        """The entry of the kwok provider's instance-types file (`INSTANCE_TYPES_FILE_PATH`)."""
        requirements = [
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
        ]
        return {
            "name": self.name,
            "offerings": [
                {"Price": round(self.price, 6), "Available": True, "Requirements": requirements}
            ],
            "architecture": "amd64",
            "operatingSystems": ["linux"],
            "resources": {
                "cpu": str(self.cpu),
                "memory": f"{self.memory_gi}Gi",
                "pods": str(self.pods),
            },
        }


# 1 CPU : 4 GiB, named as Karpenter's generator names its "standard" family
INSTANCE_TYPES = (
    InstanceType("s-4x-amd64-linux", 4, 16),
    InstanceType("s-8x-amd64-linux", 8, 32),
    InstanceType("s-16x-amd64-linux", 16, 64),
)


def instance_types_file(types: tuple[InstanceType, ...] = INSTANCE_TYPES) -> str:
    return json.dumps([t.as_kwok() for t in types], indent=2)


def made_by_karpenter(node: Obj) -> bool:
    """Whether a Node is one the kwok provider made (the kubelet simulator adopts it)."""
    meta = node.get("metadata") or {}
    marks = {**(meta.get("labels") or {}), **(meta.get("annotations") or {})}
    return marks.get(KWOK_NODE_KEY) == KWOK_NODE_VALUE


def environment(
    *, instance_types: str, metrics_port: int, health_port: int, kubeconfig: str
) -> dict[str, str]:
    """Karpenter's settings (its env variables) for the test world: one replica without
    leader election, its ports free ones (several worlds run at once), short batches."""
    return {
        "KUBECONFIG": kubeconfig,
        "INSTANCE_TYPES_FILE_PATH": instance_types,
        "DISABLE_LEADER_ELECTION": "true",
        "METRICS_PORT": str(metrics_port),
        "HEALTH_PROBE_PORT": str(health_port),
        "BATCH_IDLE_DURATION": BATCH_IDLE_DURATION,
        "BATCH_MAX_DURATION": BATCH_MAX_DURATION,
        "LOG_LEVEL": "info",
        # no cost or state metrics and Events for each node: nothing reads them here
        "DISABLE_CLUSTER_STATE_OBSERVABILITY": "true",
    }


def node_class(name: str = NODE_CLASS) -> Obj:
    """A KWOKNodeClass (Ready by its CRD's default status; nodes register at once)."""
    return {
        "apiVersion": f"{KWOK_API_GROUP}/v1alpha1",
        "kind": "KWOKNodeClass",
        "metadata": {"name": name},
    }


def node_pool(name: str, *, cpu_limit: int = 64, node_class_name: str = NODE_CLASS) -> Obj:
    """A NodePool of the kwok instance types, on demand, at most `cpu_limit` cores; an
    empty node goes at once (`WhenEmpty`, `0s`), so a test's nodes go with its pods."""
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {
                    "nodeClassRef": {
                        "group": KWOK_API_GROUP,
                        "kind": "KWOKNodeClass",
                        "name": node_class_name,
                    },
                    "requirements": [
                        {
                            "key": "karpenter.sh/capacity-type",
                            "operator": "In",
                            "values": ["on-demand"],
                        },
                    ],
                }
            },
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s"},
            "limits": {"cpu": str(cpu_limit)},
        },
    }
