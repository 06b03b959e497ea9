"""How raysize's workflows are named and found: their types, ids and search attributes.

Pure and shared: the workflows set them, the discovery activity starts reconciles by them,
the CLI and the worker's setup (which registers the search attributes) look them up. No
module here imports a workflow module, so activities may use this one.
"""

from __future__ import annotations

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

from raysize.workflows.contracts import ResizeOutcome, ResizePhase, ResizeRequest
from raysize.workflows.summaries import resize_change

# workflow types, as registered (`@workflow.defn(name=...)`)
RECONCILE_WORKFLOW = "ReconcileWorkflow"
RESIZE_WORKFLOW = "PodResizeWorkflow"
DISCOVERY_WORKFLOW = "DiscoveryWorkflow"

# search attributes: `RayCluster='demo' AND ResizeOutcome='RolledBack'` in the Temporal UI;
# ResizeChange (`grow 1 → 2 CPU`) and ResizeOutcome are the columns that tell one pod's
# resizes apart in its workflow list (the list has no column for the static summary)
RAY_CLUSTER = SearchAttributeKey.for_keyword("RayCluster")
RAY_NAMESPACE = SearchAttributeKey.for_keyword("RayNamespace")
POD_NAME = SearchAttributeKey.for_keyword("PodName")
RESIZE_PHASE = SearchAttributeKey.for_keyword("ResizePhase")
RESIZE_OUTCOME = SearchAttributeKey.for_keyword("ResizeOutcome")
RESIZE_CHANGE = SearchAttributeKey.for_keyword("ResizeChange")
# which Kubernetes cluster (RAYSIZE_CLUSTER_NAME), set only when the worker names one: two
# Kubernetes clusters may share one Temporal namespace, and both may have `default/demo`
KUBE_CLUSTER = SearchAttributeKey.for_keyword("KubeCluster")
SEARCH_ATTRIBUTES = (
    RAY_CLUSTER,
    RAY_NAMESPACE,
    POD_NAME,
    RESIZE_PHASE,
    RESIZE_OUTCOME,
    RESIZE_CHANGE,
    KUBE_CLUSTER,
)


def _scope(kube_cluster: str) -> str:
    return f"{kube_cluster}/" if kube_cluster else ""


def reconcile_workflow_id(namespace: str, cluster: str, kube_cluster: str = "") -> str:
    """`reconcile/<namespace>/<cluster>`, or `reconcile/<kube cluster>/<namespace>/<cluster>`
    when the worker names its Kubernetes cluster (RAYSIZE_CLUSTER_NAME)."""
    return f"reconcile/{_scope(kube_cluster)}{namespace}/{cluster}"


def resize_workflow_id(namespace: str, pod: str, kube_cluster: str = "") -> str:
    return f"resize/{_scope(kube_cluster)}{namespace}/{pod}"


def kube_cluster_query(kube_cluster: str) -> str:
    """The visibility filter for one Kubernetes cluster's workflows ("" : those of a
    worker that names none)."""
    return f"KubeCluster = '{kube_cluster}'" if kube_cluster else "KubeCluster IS NULL"


def shrinks(req: ResizeRequest, cpu: int, memory: int) -> bool:
    """Whether a resize to `cpu`/`memory` shrinks the pod in either: then the Raylet goes first."""
    return cpu < req.from_cpu or memory < req.from_memory


def _kube_pair(kube_cluster: str) -> list[SearchAttributePair[str]]:
    return [SearchAttributePair(KUBE_CLUSTER, kube_cluster)] if kube_cluster else []


def reconcile_search_attributes(
    namespace: str, cluster: str, kube_cluster: str = ""
) -> TypedSearchAttributes:
    """What a reconcile workflow is about, set when it starts (`RayCluster='x'` finds it)."""
    return TypedSearchAttributes(
        [
            SearchAttributePair(RAY_CLUSTER, cluster),
            SearchAttributePair(RAY_NAMESPACE, namespace),
            *_kube_pair(kube_cluster),
        ]
    )


def resize_search_attributes(req: ResizeRequest) -> TypedSearchAttributes:
    """Set when a resize starts: who it is about, what it sets out to do and its first
    phase, so the saga itself needs no upsert until its phase changes."""
    first = (
        ResizePhase.SHRINKING_RAYLET if shrinks(req, req.cpu, req.memory) else ResizePhase.POLLING
    )
    return TypedSearchAttributes(
        [
            SearchAttributePair(RAY_CLUSTER, req.cluster),
            SearchAttributePair(RAY_NAMESPACE, req.namespace),
            SearchAttributePair(POD_NAME, req.pod),
            SearchAttributePair(RESIZE_PHASE, first.value),
            SearchAttributePair(RESIZE_OUTCOME, ResizeOutcome.PENDING.value),
            SearchAttributePair(RESIZE_CHANGE, resize_change(req)),
            *_kube_pair(req.kube_cluster),
        ]
    )
