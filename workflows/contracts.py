"""What the workflows ask of the activities, and what they get back.

Each activity is called by name with one of these models, so workflows never import
activity code. Amounts are exact integers: millicores and bytes.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from typing import Final

from pydantic import Field

from raysize.workflows.ippr_status import IpprStatus
from raysize.workflows.model import ClusterSnapshot, Plan, PlannerSettings, ResizeAction
from raysize.workflows.pod_template import ConfigError
from raysize.workflows.values import Value


# --- activity names ---------------------------------------------------------------------
class Act:
    OBSERVE = "observe_cluster"
    WAIT_FOR_CHANGE = "wait_for_change"
    SCALE = "scale_groups"
    DRAIN = "drain_raylets"
    EVENT = "record_event"
    RESIZE_RAYLET = "resize_raylet"
    FINISH_RESIZE = "finish_resize"
    APPLY_RESIZE = "apply_pod_resize"
    WAIT_RESIZE = "wait_pod_resize"
    SET_STATUS = "set_ippr_status"
    LIST_CLUSTERS = "list_rayclusters"
    ENSURE_RECONCILERS = "ensure_reconcilers"


# metrics the activities record themselves (the rest are in workflows/telemetry.py)
RAY_STATE_READS = "raysize_ray_state_reads"  # GetClusterResourceState calls to a GCS
PLAN_DURATION = "raysize_plan_duration_seconds"  # wall time of one tick's plan (the observe)


# --- errors (ApplicationError types) ------------------------------------------------------
class Err:
    POD_GONE = "PodGone"
    RAYLET_GONE = "RayletNotFound"
    INVALID = "Invalid"
    FORBIDDEN = "Forbidden"
    CLUSTER_GONE = "RayClusterGone"
    RAY_INVALID = "RayInvalidArgument"
    RAY_AUTH = "RayUnauthenticated"
    OBSERVE_ONLY = "ObserveOnly"  # a write refused: the worker runs with RAYSIZE_OBSERVE_ONLY
    # 429 from the Kubernetes API server; its Retry-After is the failure's next_retry_delay
    KUBE_THROTTLED = "KubernetesThrottled"


# the worker's setting (`worker/settings.py` `observe_only`): plan, say, change nothing
OBSERVE_ONLY_VAR = "RAYSIZE_OBSERVE_ONLY"


POLL_INTERVAL_S = 5.0  # re-read a resizing pod after this much silence from its watch
# the heartbeat timeout of the saga's long activities and of the loop's drain; they beat
# well inside it
HEARTBEAT_TIMEOUT = timedelta(seconds=15)
# the reconcile loop's wait: how long a wait on a worker that died without stopping
# (SIGKILL, the OOM killer, its node lost) holds its cluster before another worker takes
# the loop on. Every running wait heartbeats (the SDK sends at most one each 0.8 of this):
# at 10 s that was 125 heartbeats a second for 1,000 clusters, a third of a core of the
# dev server beside them, and each one a Temporal action
WAIT_HEARTBEAT_TIMEOUT = timedelta(seconds=30)


# --- resize saga ---------------------------------------------------------------------------
# the pod a resize was decided on, by UID: a pod created again under its name is another
# pod, and the saga's writes fail for it as for a deleted pod (PodGone)
POD_UID_DOC = "the pod's metadata.uid the decision was made on ('' : any pod of that name)"


class RayletResizeInput(Value):
    namespace: str
    cluster: str
    pod: str
    node_id: str
    cpu: int
    memory: int
    pod_uid: str = Field(default="", description=POD_UID_DOC)


class RayletResizeResult(Value):
    cpu: int
    memory: int


class FinishResizeInput(RayletResizeInput):
    """Bring the Raylet to the pod's size, then write the pod's final ray.io/ippr-status."""

    status: IpprStatus


class FinishResizeResult(RayletResizeResult):
    status_error: str = Field("", description="why the final status was not written, if not")


CLUSTER_OF_POD_DOC = (
    "the pod's RayCluster: its Kubernetes calls take turns with other clusters' "
    "(activities/targets.py); empty from a saga an older worker started"
)


class ApplyResizeInput(Value):
    """Patch the pod, record the status, then watch the kubelet for up to `window_s`;
    with `finish`, once the kubelet is done, bring the Raylet to the pod's size and write
    the final status too: one activity (one round trip) for the whole happy path."""

    namespace: str
    pod: str
    cpu: int = Field(description="absolute size: the limit if the container has one")
    cluster: str = Field(default="", description=CLUSTER_OF_POD_DOC)
    memory: int
    status: IpprStatus = Field(description="ray.io/ippr-status to write after the patch")
    poll_interval_s: float = POLL_INTERVAL_S
    window_s: float = 30.0
    pod_uid: str = Field(default="", description=POD_UID_DOC)
    finish: FinishResizeInput | None = Field(
        default=None,
        description="once the kubelet is done, this `finish_resize` in the same activity "
        "(the saga runs it on its own if the result has no `finished`)",
    )
    expect: tuple[tuple[int, int], ...] | None = Field(
        default=None,
        description="compare-and-set: the (cpu, memory) sizes the pod may run at for this "
        "patch to go ahead (where the decision found it, and where this saga's own patches "
        "may have put it; the target itself is always fine, so a retry of a patch that "
        "landed goes on). A pod running at another size is left alone and the result is "
        "`superseded`. None: no check (a rollback goes back from wherever the pod is)",
    )


class ProgressState(StrEnum):
    DONE = "done"
    IN_PROGRESS = "in_progress"
    DEFERRED = "deferred"
    INFEASIBLE = "infeasible"
    ERROR = "error"
    POD_GONE = "pod_gone"
    # the pod is not where the resize was decided from (a stale read, or a change since):
    # nothing was written, and the next tick decides again on a fresh read
    SUPERSEDED = "superseded"


class WaitResizeInput(Value):
    namespace: str
    pod: str
    cpu: int
    memory: int
    generation: int
    poll_interval_s: float = POLL_INTERVAL_S
    window_s: float = 30.0  # return IN_PROGRESS after this long, so the workflow can time out
    pod_uid: str = Field(default="", description=POD_UID_DOC)
    cluster: str = Field(default="", description=CLUSTER_OF_POD_DOC)


class ResizeProgress(Value):
    """Where a pod's resize stands. The gaps let the workflow turn a kubelet report
    (which speaks of requests) into the size to ask for next (which is a limit)."""

    state: ProgressState
    message: str = ""
    reason: str = ""
    cpu: int = 0  # what the container actually runs with (status.resources)
    memory: int = 0
    cpu_gap: int = 0  # limit − request
    memory_gap: int = 0
    other_cpu_requests: int = 0  # the pod's other containers
    other_memory_requests: int = 0


class ApplyResizeResult(Value):
    generation: int
    progress: ResizeProgress
    finished: FinishResizeResult | None = Field(
        default=None,
        description="the input's `finish`, done (None: not asked, the kubelet not done, or "
        "it did not take: the saga's own `finish_resize` does it, with its retries)",
    )


class SetStatusInput(Value):
    namespace: str
    pod: str
    status: IpprStatus
    pod_uid: str = Field(default="", description=POD_UID_DOC)
    cluster: str = Field(default="", description=CLUSTER_OF_POD_DOC)


KUBE_CLUSTER_DOC = (
    "the worker's RAYSIZE_CLUSTER_NAME: which Kubernetes cluster the RayCluster is in, part "
    "of the workflow IDs when set (several Kubernetes clusters in one Temporal namespace)"
)


class ResizeRequest(Value):
    """Start (or retarget) the resize of one pod."""

    namespace: str
    cluster: str
    pod: str
    group: str
    node_id: str
    from_cpu: int
    from_memory: int
    cpu: int
    memory: int
    timeout_s: int
    reason: str = ""
    pod_uid: str = Field(default="", description=POD_UID_DOC)
    max_attempts: int = 3
    poll_interval_s: float = POLL_INTERVAL_S
    poll_window_s: float = 30.0
    demand_seen_at: float | None = Field(
        default=None,
        description="epoch seconds when raysize first saw the pending demand behind this "
        "resize (None: not demand-driven); feeds raysize_demand_to_resize_seconds",
    )
    kube_cluster: str = Field(default="", description=KUBE_CLUSTER_DOC)


class ResizePhase(StrEnum):
    STARTING = "Starting"
    SHRINKING_RAYLET = "ShrinkingRaylet"
    POLLING = "Polling"
    SYNCING_RAYLET = "SyncingRaylet"
    ROLLING_BACK = "RollingBack"
    DONE = "Done"


class ResizeOutcome(StrEnum):
    PENDING = "Pending"
    SUCCEEDED = "Succeeded"
    ROLLED_BACK = "RolledBack"
    CANCELED = "Canceled"
    POD_GONE = "PodGone"
    RAYLET_GONE = "RayletGone"  # the pod resized, its Raylet gone: nothing to sync
    # the pod was not at the size the resize was decided from: not patched, no rollback
    SUPERSEDED = "Superseded"
    FAILED = "Failed"


class FailureCause(StrEnum):
    """Why a resize did not take: typed where it happens, so that a metric label or a
    filter never depends on how a message is worded (the values are the metric labels)."""

    CANCELED = "canceled"  # an operator canceled the saga
    TIMEOUT = "timeout"  # the kubelet did not finish within resize-timeout
    MAX_ATTEMPTS = "max_attempts"  # the kubelet or the API failed max-attempts times
    REFUSED = "refused"  # the API server refused the patch (422, 403 …)
    DEFERRED = "deferred"  # the kubelet: no room on the node now
    INFEASIBLE = "infeasible"  # the kubelet: never room on the node
    ACTIVITY_ERROR = "activity_error"  # an activity gave up (its retries spent)
    KUBELET_ERROR = "kubelet_error"  # the kubelet reported an actuation error
    POD_GONE = "pod_gone"
    RAYLET_GONE = "raylet_gone"
    SUPERSEDED = "superseded"  # the pod was not where the decision saw it: not patched
    UNKNOWN = "unknown"


# the kubelet's PodResizePending reasons
PENDING_CAUSES: Final = {"Deferred": FailureCause.DEFERRED, "Infeasible": FailureCause.INFEASIBLE}


class AttemptRecord(Value):
    cpu: int
    memory: int
    result: str


class ResizeSagaState(Value):
    """Where a resize saga stands: what `temporal workflow query --name state` returns
    for a resize, and its result."""

    pod: str
    phase: ResizePhase
    outcome: ResizeOutcome
    from_cpu: int
    from_memory: int
    cpu: int
    memory: int
    paused: bool = False
    attempts: tuple[AttemptRecord, ...] = ()
    raylet_cpu: int | None = None
    raylet_memory: int | None = None
    detail: str = ""


# --- reconcile ---------------------------------------------------------------------------
class GcsTimetable(Value):
    """When a GCS publishes Ray's task demands, as far as one worker learned it
    (`activities.gcs_cadence`): each wait returns it, and the reconcile hands it to the
    next, which may run on another worker (that one would otherwise learn only from the
    changes its own reads saw, and read at random moments meanwhile: a new demand seen
    0.28 s late on average)."""

    address: str = Field(description="the GCS it is of")
    period: tuple[float, float] = Field(description="the period's bounds, s")
    windows: tuple[tuple[int, float, float], ...] = Field(
        description="publications seen: (number, earliest, latest instant), epoch s on the "
        "learning worker's clock"
    )
    confirmed: int = Field(default=0, description="windows that fitted the timetable")


class WaitResult(Value):
    """What a wait for a change ends with (`Act.WAIT_FOR_CHANGE`)."""

    changed: bool = Field(description="False: the timeout passed quietly")
    gcs_timetable: GcsTimetable | None = Field(
        default=None, description="what this worker knows of the GCS's timetable, if anything"
    )


class ClusterRead(Value):
    """What one observe read that the reconcile acts on: in the activity's `Observation`
    and, from there, in the `Tick` the workflow records."""

    found: bool = True
    config_errors: tuple[ConfigError, ...] = ()
    in_tree_autoscaling: bool = Field(
        default=False, description="spec.enableInTreeAutoscaling: Ray's autoscaler acts"
    )
    ray_autoscaler_pod: str = Field(
        default="",
        description="the head pod whose `autoscaler` container (Ray's autoscaler, KubeRay's "
        "sidecar) is running; KubeRay does not restart the head when the flag changes",
    )
    replicas: dict[str, int] = Field(default_factory=dict)
    generation: int = Field(
        default=0, description="the RayCluster's metadata.generation: the spec decided from"
    )
    stale_to_delete: tuple[str, ...] = Field(
        default=(), description="names in workersToDelete whose pod no longer exists"
    )
    gcs_address: str = ""
    gcs_version: int = 0
    # the cluster's pods' names and resourceVersions, hashed (`pod_watch.pods_mark`): only
    # equality means anything
    pods_version: str = ""
    cluster_mark: str = Field(
        default="", description="the RayCluster's spec generation and annotations, hashed"
    )
    resizing: tuple[str, ...] = Field(
        default=(), description="pods with a resize in flight (conditions or resizing-at)"
    )

    @property
    def ray_autoscaler_acts(self) -> bool:
        """Ray's own autoscaler owns the cluster (the flag, or its sidecar still running in
        the head): an acting raysize stands by; observe-only plans beside it."""
        return self.in_tree_autoscaling or bool(self.ray_autoscaler_pod)


class Observation(ClusterRead):
    """The whole read, snapshot included: it stays inside the observe activity."""

    snapshot: ClusterSnapshot | None = None
    ippr_enabled: bool = False
    workers_to_delete: tuple[str, ...] = ()
    resource_version: str = ""
    ray_read_at: float | None = Field(
        default=None, description="epoch s (this worker's clock): Ray's state read was answered"
    )
    demand_published: tuple[float, float] | None = Field(
        default=None,
        description="epoch s (this worker's clock): (earliest, latest) instant of Ray's last "
        "task-demand publication before the read was sent (`GcsCadence.last_publication`); "
        "None: not known",
    )


class DrainedPod(Value):
    """A pod whose drain Ray accepted: it must be removed, even after a worker crash."""

    pod: str
    group: str
    uid: str = ""
    reason: str = ""


class Memory(Value):
    """What the reconcile loop remembers between ticks and the plan depends on: given to
    the observe with each tick and handed back updated (`workflows/decide.py`), so the
    planner's inputs are all in the activity's input and its decision is recorded in the
    activity's result, never recomputed on replay. Times are the workflow's clock."""

    drained: tuple[DrainedPod, ...] = Field(
        default=(), description="pods whose drain Ray accepted, until a write names them"
    )
    demand_seen_at: float | None = Field(
        default=None, description="epoch s: since when Ray has reported pending demand"
    )
    drift_since: dict[str, float] = Field(
        default_factory=dict, description="pod → since when its Raylet has differed from it"
    )
    growing: dict[str, tuple[int, int, float]] = Field(
        default_factory=dict,
        description="pod → its size (millicores, bytes) when a grow started, and when",
    )
    landed: dict[str, tuple[float, int, int]] = Field(
        default_factory=dict, description="pod → when its grow was seen landed, and its size"
    )
    landed_seen: dict[str, float] = Field(
        default_factory=dict,
        description="pod → epoch s (the observe's clock) the Ray read that saw its grow landed "
        "was answered: its hold ends at Ray's first demand publication after it",
    )
    grow_used: dict[str, tuple[int, int]] = Field(
        default_factory=dict,
        description="pod → what Ray ran on it (millicores, bytes) when its grow was planned",
    )
    reported: tuple[str, ...] = Field(
        default=(),
        description="observe-only: the actions (`would_key`) already said in a Would* Event, "
        "so an unchanged plan is not said again every tick",
    )
    moved: dict[str, tuple[str, int, int, float]] = Field(
        default_factory=dict,
        description="pod → its UID, the size (millicores, bytes) its last saga moved it away "
        "from, and when that saga ended: a read showing the pod there again soon after is "
        "older than the saga's write (`reconcile_workflow._fresh`)",
    )


class LoopSettings(Value):
    """The worker's settings a running reconcile loop follows (issue #43 item 5): the
    worker that runs an observe sends its own (`ClusterActivities.loop`), the tick records
    them (`Tick.in_force`), and a loop started to follow the worker
    (`ReconcileInput.follow_worker`) uses them from that tick on and carries them through
    continue-as-new. So a setting changed in the worker's configuration (`helm upgrade
    --set config.RAYSIZE_IDLE_TIMEOUT_S=…`, which restarts the worker) reaches every loop
    at its next tick."""

    tick_s: float
    max_concurrent_resizes: int
    resize_poll_interval_s: float
    settings: PlannerSettings


class ObserveInput(Value):
    """Read the cluster and plan on what was read (`Act.OBSERVE`)."""

    namespace: str
    cluster: str
    gcs_address: str | None = None
    settings: PlannerSettings = Field(
        default_factory=PlannerSettings,
        description="the worker's defaults; the RayCluster's autoscalerOptions win",
    )
    memory: Memory = Field(default_factory=Memory)
    now: float = Field(default=0.0, description="the workflow's clock, epoch s")
    max_resizes: int | None = Field(
        default=None,
        description="resizes that may run at once (ReconcileInput.max_concurrent_resizes): "
        "the tick records no more new ones than that leaves room for (None: all)",
    )
    follow_worker: bool = Field(
        default=False,
        description="plan with the observing worker's settings, not `settings` and "
        "`max_resizes` (ReconcileInput.follow_worker)",
    )


class PodRef(Value):
    """A pod a decision acts on, as the observe saw it."""

    group: str
    uid: str = ""  # "" : not created yet
    raylet_id: str = ""  # "" : no live Raylet


class GroupRef(Value):
    pods: int = Field(default=0, description="its pods at the observe, drained ones left out")
    max_workers: int | None = None
    resize_timeout_s: int = 60


class WouldEvent(Value):
    """A Kubernetes Event on the RayCluster saying what an observe-only tick would do."""

    reason: str = Field(description="WouldResize, WouldScaleOut, WouldScaleIn or WouldSettle")
    message: str


class WouldDo(Value):
    """What an observe-only tick would have carried out (`workflows/decide.py`): the plan
    and the settles, one line each, and the Events for what was not said before."""

    plan: Plan = Field(default_factory=Plan)
    stuck: tuple[ResizeAction, ...] = ()
    lines: tuple[str, ...] = Field(default=(), description="one per action: 'would grow …'")
    events: tuple[WouldEvent, ...] = Field(
        default=(), description="only the actions not said before (`Memory.reported`)"
    )

    @property
    def is_empty(self) -> bool:
        return not self.lines


# At most this many pod names in a tick's result (`Tick.pods`, for `raysize status`):
# a bigger cluster's names would cost the history more than everything else a tick records.
MAX_NAMED_PODS = 500
# At most this many removals in one tick (`decide.within_removal_budget`); the rest are
# planned again at the next tick, which the removed pods' deletion brings. Every removal
# is in the tick (its action and its pod's reference), its drain and its RayCluster
# write: 5,000 made a 1.1 MB tick record, and near 10,000 one passed Temporal's 2 MB
# payload limit, so that tick could never be recorded. At 500 a tick's records stay
# under 512 KB however big the cluster (`python -m bench.tick_record_bench`).
MAX_REMOVALS_PER_TICK = 500


class Tick(ClusterRead):
    """One observe and the plan made on it: what the reconcile workflow records and acts
    on. The snapshot the plan was made from stays in the activity (at 5,000 pods it
    would be megabytes of history per tick); only the pods the decision names are here."""

    read_ray: bool = Field(default=False, description="Ray was read: a plan could be made")
    pod_count: int = 0
    pods: tuple[str, ...] | None = Field(
        default=None, description=f"the pods' names (None: not read, or over {MAX_NAMED_PODS})"
    )
    plan: Plan | None = Field(default=None, description="None: no plan (standing by, errors)")
    stuck: tuple[ResizeAction, ...] = Field(
        default=(), description="resizes nobody works on any more: settle each to its pod"
    )
    next_decision_in: float | None = None
    memory: Memory = Field(default_factory=Memory)
    refs: dict[str, PodRef] = Field(
        default_factory=dict, description="the pods the plan, the settles and drains name"
    )
    groups: dict[str, GroupRef] = Field(default_factory=dict)
    held_resizes: int = Field(
        default=0, description="resizes planned but left out: no room under max_resizes"
    )
    plan_s: float = Field(default=0.0, description="wall time of the plan, s")
    observe_only: bool = Field(
        default=False,
        description=f"the worker that observed runs with {OBSERVE_ONLY_VAR}: `plan` and "
        "`stuck` are empty, `would` says what would have been done",
    )
    would: WouldDo | None = Field(
        default=None, description="observe-only: the plan that was not carried out"
    )
    in_force: LoopSettings | None = Field(
        default=None,
        description="the observing worker's settings, which the plan was made with (None: "
        "a worker that sends none, or before 0.2)",
    )


class WaitInput(Value):
    namespace: str
    cluster: str
    gcs_address: str
    gcs_version: int
    pods_version: str
    timeout_s: float
    cluster_mark: str = ""  # wake when the RayCluster's mark differs ("" : pods only)
    # False: raysize may not act on the cluster (config error, Ray's autoscaler owns it),
    # so Ray's demands cannot change a decision: Kubernetes changes only, no GCS reads
    watch_ray: bool = True
    # the GCS's timetable as the last wait's worker knew it (None: nothing learned)
    gcs_timetable: GcsTimetable | None = None


class ScaleInput(Value):
    """Set each group's replicas and name the pods to remove, in one write.

    `replicas` goes down by exactly the pods named in `workers_to_delete` that still exist
    with the UID in `pod_uids` (a pod replaced since the decision keeps its replica: KubeRay
    would otherwise delete a pod of its own choosing). The write is refused (`Conflict`)
    when the RayCluster's spec moved past `generation`, the one decided from."""

    namespace: str
    cluster: str
    resource_version: str = ""  # no longer a guard: every KubeRay status write moves it
    replicas: dict[str, int]
    workers_to_delete: dict[str, tuple[str, ...]]
    generation: int = 0  # 0: not guarded
    pod_uids: dict[str, str] = Field(
        default_factory=dict, description="pod name → the UID decided on ('' : any)"
    )
    launch_sizes: dict[str, tuple[int, int]] = Field(
        default_factory=dict,
        description="group → (millicores, bytes) its new pods start at; a group whose "
        "replicas go up and is not named here starts at its template's size",
    )


class DrainTarget(Value):
    pod: str
    node_id: str = Field(description="the pod's Raylet, 56 hex characters")
    reason: str = Field(description="why it goes: sent to Ray as the drain's reason message")


class DrainInput(Value):
    """Ask Ray to drain these Raylets (idle termination): each is removed only if Ray
    accepted, since a Raylet that runs work refuses."""

    namespace: str
    cluster: str
    gcs_address: str
    targets: tuple[DrainTarget, ...]


class DrainResult(Value):
    accepted: tuple[str, ...] = Field(default=(), description="pods whose drain Ray accepted")
    refused: dict[str, str] = Field(
        default_factory=dict, description="pod → Ray's reason for refusing its drain"
    )


class EventInput(Value):
    namespace: str
    kind: str  # "RayCluster" | "Pod"
    name: str
    reason: str
    message: str
    warning: bool = False


class Decision(Value):
    tick: int
    summary: str
    reasons: tuple[str, ...] = ()


class ReconcileStatus(Value):
    """What `temporal workflow query --name status` returns for a cluster."""

    namespace: str
    cluster: str
    paused: bool
    ticks: int
    last_plan: Plan | None = None
    config_errors: tuple[str, ...] = ()
    decisions: tuple[Decision, ...] = ()
    resizes_started: int = 0
    last_error: str = ""
    stood_down: bool = Field(
        default=False, description="Ray's in-tree autoscaler owns the cluster: no action"
    )
    ray_autoscaler_pod: str = Field(
        default="",
        description="standing by because Ray's autoscaler still runs in this head pod, "
        "though spec.enableInTreeAutoscaling is false",
    )
    pods: tuple[str, ...] | None = Field(
        default=None, description="the cluster's pods at the last observe (None: not read yet)"
    )
    observe_only: bool = Field(
        default=False,
        description=f"the last tick was observed by a worker with {OBSERVE_ONLY_VAR}: it "
        "plans and says what it would do, and changes nothing",
    )
    would: tuple[str, ...] = Field(
        default=(), description="observe-only: what the last plan would have done, a line each"
    )
    in_force: LoopSettings | None = Field(
        default=None,
        description="the settings the loop decides with now (the worker's, as of its last "
        "tick, when it follows the worker; else those it was started with)",
    )
    observe_failures: int = Field(
        default=0,
        description="observes failed in a row (0: the last one read the cluster); the loop "
        "waits longer after each, see ReconcileInput.retry_s and retry_max_s",
    )


class ReconcileCarry(Value):
    """Everything that outlives one run: exactly what continue-as-new carries."""

    ticks: int = 0
    paused: bool = False
    decisions: tuple[Decision, ...] = ()
    config_errors: tuple[str, ...] = ()
    resizes_started: int = 0
    # Ray's in-tree autoscaler owns the cluster (spec.enableInTreeAutoscaling: true, or
    # its sidecar still runs in the head pod named by ray_autoscaler_pod)
    stood_down: bool = False
    ray_autoscaler_pod: str = ""
    # what the plan depends on besides the cluster: drained pods (a drained Raylet takes no
    # new work, so a lost removal would strand its pod), grows just landed, drift clocks
    memory: Memory = Field(default_factory=Memory)
    # the last tick was observe-only (a change is logged and said in an Event)
    observe_only: bool = False
    # observes failed in a row: the back-off goes on growing across continue-as-new (a
    # fleet whose API server is down, moved to a new version together, would otherwise
    # all retry at the short first wait again, together)
    observe_failures: int = 0


class ReconcileInput(Value):
    namespace: str
    cluster: str
    kube_cluster: str = Field(default="", description=KUBE_CLUSTER_DOC)
    gcs_address: str | None = None
    # the longest wait: a safety net; changes and the plan's own deadlines wake sooner
    tick_s: float = 300.0
    # the wait after a failed read (the observe's three attempts, or the watch), doubled
    # after each further failure in a row up to `retry_max_s`, then jittered: each wait
    # is between half and all of that (`workflows/waiting.py` `backoff_s`)
    retry_s: float = 5.0
    # at most this long: a loop in its longest back-off acts again within it once the API
    # server or GCS is back (issue #30: within 30 s of an API server's throttling ending;
    # at 60 s the APF test's loops took up to a minute after a long enough outage)
    retry_max_s: float = 20.0
    max_concurrent_resizes: int = 100
    resize_poll_interval_s: float = POLL_INTERVAL_S
    resize_poll_window_s: float = 30.0
    settings: PlannerSettings = Field(default_factory=PlannerSettings)
    max_ticks_per_run: int = 200  # continue-as-new at the latest after this many ticks
    # the loop takes tick_s, max_concurrent_resizes, resize_poll_interval_s and settings
    # from each tick's `in_force` (the worker's configuration as it is now) instead of
    # keeping the values it was started with; discovery and `raysize start` set it
    follow_worker: bool = False

    @property
    def loop(self) -> LoopSettings:
        """The settings this loop decides with (`LoopSettings`)."""
        return LoopSettings(
            tick_s=self.tick_s,
            max_concurrent_resizes=self.max_concurrent_resizes,
            resize_poll_interval_s=self.resize_poll_interval_s,
            settings=self.settings,
        )

    def with_loop(self, loop: LoopSettings) -> ReconcileInput:
        """This input deciding with `loop` instead."""
        return self.model_copy(update=dict(loop))

    carry: ReconcileCarry = Field(default_factory=ReconcileCarry)
