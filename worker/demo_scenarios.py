"""The stories `raysize demo` tells: the sandbox's nodes, the RayCluster, the Ray workload,
and how each story is known to have reached its end.

The workload is a Ray driver run as a separate process with the venv's Python: raysize's
own code never imports Ray.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raysize.sandbox.kubelet import NodeSpec
from raysize.workflows.contracts import ResizeOutcome
from raysize.workflows.resources import GIB

CLUSTER = "demo"
NAMESPACE = "default"
GROUP = "small"
TEMPLATE_CPU = 1000  # millicores: the worker template's size


@dataclass
class ResizeView:
    """One resize workflow run, as the demo sees it."""

    workflow_id: str
    run_id: str
    pod: str
    status: str  # Temporal's execution status: RUNNING, COMPLETED, …
    phase: str
    outcome: str
    from_cpu: int = 0
    cpu: int = 0
    from_memory: int = 0
    memory: int = 0
    attempts: tuple[str, ...] = ()
    attempt_cpus: tuple[int, ...] = ()  # millicores asked for, one per attempt
    detail: str = ""
    started: float = 0.0  # epoch seconds the workflow run started

    @property
    def closed(self) -> bool:
        return self.status != "RUNNING"


@dataclass
class Progress:
    """What the story's end check looks at."""

    resizes: list[ResizeView]
    initial_workers: set[str]
    workers_seen: set[str]
    workload_rc: int | None  # None: still running (or not started)


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    expect: str  # the expected end, in words
    nodes: tuple[NodeSpec, ...]
    workload: tuple[dict[str, Any], ...]
    resize_timeout_s: int = 30
    idle_timeout_s: int | None = None
    min_workers: int = 0  # the worker group's minReplicas
    # a non-Ray pod taking this many millicores on the first node (0: none)
    neighbour_cpu: int = 0
    check: Callable[[Progress], list[str]] = field(default=lambda p: [])

    def missing(self, progress: Progress) -> list[str]:
        """What the story still lacks; empty once it reached its end."""
        out = []
        if progress.workload_rc != 0:
            out.append("the workload has not finished")
        return out + self.check(progress)


def _succeeded(p: Progress, grow: bool = True) -> list[ResizeView]:
    return [
        r
        for r in p.resizes
        if r.outcome == ResizeOutcome.SUCCEEDED.value and (r.cpu > r.from_cpu) == grow
    ]


def _grow_check(p: Progress) -> list[str]:
    return [] if _succeeded(p) else ["no resize has grown a pod yet"]


def _grow_twice_check(p: Progress) -> list[str]:
    """The `grow` story as its title tells it: the first worker grows 1 → 2 CPU for the
    task, then the same pod 2 → 4 CPU for both bundles of the placement group (the task
    has finished by then, so the pod's room and its growth hold the group: growing a pod
    comes before launching one), and no pod is launched."""
    out = []
    grown = {(r.from_cpu, r.cpu) for r in _succeeded(p) if r.pod in p.initial_workers}
    for a, b in ((TEMPLATE_CPU, 2000), (2000, 4000)):
        if (a, b) not in grown:
            out.append(f"the first worker has not grown {a // 1000} → {b // 1000} CPU yet")
    if launched := sorted(p.workers_seen - p.initial_workers):
        out.append(f"a pod was launched ({', '.join(launched)}): the story grows the first one")
    return out


def _timeout_check(p: Progress) -> list[str]:
    out = []
    if not any(r.outcome == ResizeOutcome.ROLLED_BACK.value for r in p.resizes):
        out.append("no resize was rolled back yet")
    if not p.workers_seen - p.initial_workers:
        out.append("no worker pod was launched yet")
    return out


def _deferred_check(p: Progress) -> list[str]:
    # right-sizing would ask for 3 CPU; the node has room for 2.5: the grow asks for that
    ok = [r for r in _succeeded(p) if r.cpu == 2500]
    return [] if ok else ["no resize has grown a pod to the 2.5 CPU its node has room for yet"]


def _idle_check(p: Progress) -> list[str]:
    out = _grow_check(p)
    shrunk = [r for r in _succeeded(p, grow=False) if r.cpu == TEMPLATE_CPU]
    if not shrunk:
        out.append("the idle pod has not shrunk back to its template size yet")
    return out


def _tasks(*cpus: float, hold_s: float = 2.0) -> dict[str, Any]:
    return {"kind": "tasks", "cpus": list(cpus), "hold_s": hold_s}


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="grow",
            title="a 1-CPU worker grows in place to 2 CPU for a 2-CPU task, then to 4 CPU for "
            "a placement group of two 2-CPU bundles: no pod is launched",
            expect="the workload finished; the first worker grew 1 → 2 CPU, then 2 → 4 CPU "
            "(Succeeded), no pod launched",
            nodes=(NodeSpec("node-a", 8000, 32 * GIB),),
            workload=(
                _tasks(2),
                {
                    "kind": "placement_group",
                    "bundles": [{"CPU": 2}, {"CPU": 2}],
                    "strategy": "PACK",
                    "hold_s": 2.0,
                },
            ),
            check=_grow_twice_check,
        ),
        Scenario(
            name="timeout",
            title="the first worker's node never actuates a resize: timeout, rollback; a "
            "second pod is launched instead, at the task's size",
            expect="a resize RolledBack after its timeout, a pod launched, the workload finished",
            nodes=(
                NodeSpec("stuck-node", 1500, 8 * GIB, stalls_actuation=True),
                NodeSpec("node-b", 8000, 32 * GIB),
            ),
            # 1 → 1.5 CPU: the stuck node has the room (a grow its node cannot take is never
            # started), and never actuates it
            workload=(_tasks(1.5),),
            resize_timeout_s=5,
            check=_timeout_check,
        ),
        Scenario(
            name="deferred",
            title="the node is too full for the right size: raysize reads the node's room and "
            "grows the pod to what fits (2.5 CPU, not the 3 right-sizing asks), never deferred",
            expect="a resize succeeded at 2.5 CPU, the workload finished",
            nodes=(NodeSpec("small-node", 3000, 16 * GIB),),
            workload=(_tasks(2.5),),
            neighbour_cpu=500,
            check=_deferred_check,
        ),
        Scenario(
            name="idle",
            title="a worker grows for a task, then shrinks back to its template size when idle",
            expect="a pod grew, the workload finished, the idle pod shrank back to 1 CPU",
            nodes=(NodeSpec("node-a", 8000, 32 * GIB),),
            workload=(_tasks(2),),
            idle_timeout_s=3,
            # the worker may not be removed as idle before the task reaches it: this story
            # is about shrinking back, not scaling in
            min_workers=1,
            check=_idle_check,
        ),
    )
}


def ray_pod_template(cpu: str, memory: str) -> dict[str, Any]:
    """A Ray pod's template of this size (requests = limits) whose CPU and memory resize
    in place without a restart: the demo's, and the tests' and benchmarks' clusters'."""
    return {
        "spec": {
            "containers": [
                {
                    "name": "ray-worker",
                    "image": "rayproject/ray:2.60.0",
                    "resources": {
                        "requests": {"cpu": cpu, "memory": memory},
                        "limits": {"cpu": cpu, "memory": memory},
                    },
                    "resizePolicy": [
                        {"resourceName": "cpu", "restartPolicy": "NotRequired"},
                        {"resourceName": "memory", "restartPolicy": "NotRequired"},
                    ],
                }
            ]
        }
    }


def raycluster(scenario: Scenario) -> dict[str, Any]:
    """The demo's RayCluster: one 1-CPU worker that may grow to 4 CPUs in place."""
    template = ray_pod_template

    options: dict[str, Any] = {}
    if scenario.idle_timeout_s is not None:
        options["idleTimeoutSeconds"] = scenario.idle_timeout_s
    ippr = {
        "groups": {
            GROUP: {
                "max-cpu": "4",
                "max-memory": "4Gi",
                "resize-timeout": scenario.resize_timeout_s,
            }
        }
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": CLUSTER, "annotations": {"ray.io/ippr": json.dumps(ippr)}},
        "spec": {
            "autoscalerOptions": options,
            "headGroupSpec": {"rayStartParams": {}, "template": template("0", "1Gi")},
            "workerGroupSpecs": [
                {
                    "groupName": GROUP,
                    "replicas": 1,
                    "minReplicas": scenario.min_workers,
                    "maxReplicas": 4,
                    "rayStartParams": {},
                    "template": template("1", "1Gi"),
                    "scaleStrategy": {"workersToDelete": []},
                }
            ],
        },
    }


def neighbour_pod(millicores: int, node: str) -> dict[str, Any]:
    """A pod that is not Ray's, taking room on the node (so a resize gets Deferred)."""
    cpu = f"{millicores}m"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "noisy-neighbour", "labels": {"app": "noisy-neighbour"}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "busy",
                    "image": "busybox",
                    "resources": {
                        "requests": {"cpu": cpu, "memory": "256Mi"},
                        "limits": {"cpu": cpu, "memory": "256Mi"},
                    },
                }
            ],
        },
    }


# The Ray driver: argv = GCS address, the workload (JSON), a timeout per step in seconds.
DRIVER = textwrap.dedent(
    """
    import json, sys, time
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    def say(line):
        print(line, flush=True)

    ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)
    steps, timeout = json.loads(sys.argv[2]), float(sys.argv[3])

    @ray.remote
    def work(hold_s):
        time.sleep(hold_s)  # hold the CPUs a while, like real work
        return ray.get_runtime_context().get_node_id()

    for step in steps:
        hold = step.get("hold_s", 0)
        if step["kind"] == "tasks":
            cpus = step["cpus"]
            say(f"submitting {len(cpus)} task(s) of {', '.join(f'{c:g}' for c in cpus)} CPU")
            refs = [work.options(num_cpus=c).remote(hold) for c in cpus]
            for c, node in zip(cpus, ray.get(refs, timeout=timeout)):
                say(f"task of {c:g} CPU ran on node {node}")
        else:
            bundles, strategy = step["bundles"], step["strategy"]
            shape = " + ".join(f"{{CPU: {b['CPU']:g}}}" for b in bundles)
            say(f"creating placement group {shape} {strategy}")
            pg = placement_group(bundles, strategy=strategy)
            ray.get(pg.ready(), timeout=timeout)
            say("placement group ready")
            refs = [
                work.options(
                    num_cpus=b["CPU"],
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=pg, placement_group_bundle_index=i
                    ),
                ).remote(hold)
                for i, b in enumerate(bundles)
            ]
            for b, node in zip(bundles, ray.get(refs, timeout=timeout)):
                say(f"bundle task of {b['CPU']:g} CPU ran on node {node}")
            remove_placement_group(pg)
    say("workload finished")
    """
)
