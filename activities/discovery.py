"""Discovery's activities: find the RayClusters to manage, and make sure each has its
reconcile workflow (`start_reconciler`, which `raysize start` uses too)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from raysize.activities.k8s import Kube
from raysize.activities.k8s_errors import Forbidden, KubeError, NotFound
from raysize.activities.targets import Targets
from raysize.workflows.contracts import (
    Act,
    ReconcileInput,
)
from raysize.workflows.naming import (
    RECONCILE_WORKFLOW,
    reconcile_search_attributes,
    reconcile_workflow_id,
)
from raysize.workflows.summaries import reconcile_details, reconcile_summary

log = logging.getLogger("raysize.activities")


OPT_IN_ANNOTATION = "raysize.io/enabled"
IPPR_ANNOTATION = "ray.io/ippr"


def is_managed(rc: dict[str, Any], opt_in_annotation: str = OPT_IN_ANNOTATION) -> bool:
    """The RayCluster asks to be managed: it has ray.io/ippr, or the opt-in annotation
    set to "true" (what discovery manages, and what `raysize doctor` checks)."""
    ann = (rc.get("metadata") or {}).get("annotations") or {}
    return IPPR_ANNOTATION in ann or ann.get(opt_in_annotation) == "true"


def list_rayclusters(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    """Every RayCluster in a namespace ("" for all namespaces)."""
    return kube.list_rayclusters(namespace)


async def start_reconciler(
    client: Client, inp: ReconcileInput, task_queue: str
) -> WorkflowHandle[Any, str]:
    """Start the reconcile workflow of a RayCluster, with its search attributes; one that
    is already running is kept (and returned)."""
    # by its type name: activities never import a workflow module
    return await client.start_workflow(
        RECONCILE_WORKFLOW,
        inp,
        result_type=str,
        id=reconcile_workflow_id(inp.namespace, inp.cluster, inp.kube_cluster),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        search_attributes=reconcile_search_attributes(inp.namespace, inp.cluster, inp.kube_cluster),
        static_summary=reconcile_summary(inp.namespace, inp.cluster),
        static_details=reconcile_details(inp.namespace, inp.cluster),
    )


RECHECK_AFTER_S = 120.0


@dataclass
class DiscoveryActivities:
    """Find RayClusters to manage and make sure each has its reconcile workflow."""

    kube: Kube
    temporal: Client
    task_queue: str
    start_input: Callable[[str, str], ReconcileInput]
    opt_in_annotation: str = OPT_IN_ANNOTATION
    kube_cluster: str = ""  # RAYSIZE_CLUSTER_NAME: part of the reconcile ids when set
    # reconcile ids seen running (or canceled), and when: a hundred clusters need not be
    # described every round; one that ended is restarted within RECHECK_AFTER_S
    _seen: dict[str, float] = field(default_factory=dict)
    # the worker's threads for blocking calls (activities/targets.py)
    targets: Targets = field(default_factory=Targets)

    @activity.defn(name=Act.LIST_CLUSTERS)
    async def list_rayclusters(self, namespaces: list[str]) -> list[tuple[str, str]]:
        """(namespace, name) of clusters with ray.io/ippr or the opt-in annotation."""
        out: list[tuple[str, str]] = []
        for ns in namespaces or [""]:
            try:
                items = await self.targets.on_kube(self.kube, list_rayclusters, self.kube, ns)
            except (Forbidden, NotFound) as exc:
                # one namespace raysize may not read (no Role there, or not created yet)
                # must not stop discovery in the others: say so, and go on
                log.warning("discovery skips namespace %r: %s", ns, exc)
                continue
            except KubeError as exc:  # one line, typed: "cannot reach … at …: refused"
                raise exc.to_application_error() from None
            for rc in items:
                if is_managed(rc, self.opt_in_annotation):
                    meta = rc["metadata"]
                    out.append((meta.get("namespace", ns), meta["name"]))
        return sorted(out)

    @activity.defn(name=Act.ENSURE_RECONCILERS)
    async def ensure_reconcilers(self, clusters: list[tuple[str, str]]) -> int:
        """Start a reconcile workflow for each cluster that has none running.

        A cluster whose last reconcile was canceled (`raysize stop`, or `temporal workflow
        cancel`) stays unmanaged: that was an operator's decision, and only `raysize start`
        undoes it."""
        started = 0
        for ns, name in clusters:
            wf_id = reconcile_workflow_id(ns, name, self.kube_cluster)
            if time.monotonic() - self._seen.get(wf_id, -RECHECK_AFTER_S) < RECHECK_AFTER_S:
                continue
            try:
                desc = await self.temporal.get_workflow_handle(wf_id).describe()
                if desc.status in (
                    WorkflowExecutionStatus.RUNNING,
                    WorkflowExecutionStatus.CANCELED,
                ):
                    self._seen[wf_id] = time.monotonic()
                    continue
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
            await start_reconciler(self.temporal, self.start_input(ns, name), self.task_queue)
            log.info("started %s: RayCluster %s/%s is managed by raysize", wf_id, ns, name)
            started += 1
        return started
