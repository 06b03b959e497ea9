"""ReconcileWorkflow (`reconcile/<namespace>/<cluster>`): observe → plan → act → wait.

One per RayCluster. Observing and acting are activities; planning is the pure `plan()`.
Waiting is event-driven: one activity watches the cluster's pods and the RayCluster
(Kubernetes watches) and Ray's state (the GCS has no watch, so it is read — every 0.1 s
right after an observe, once quiet just after each of the GCS's demand publications, or
every 0.55 s while their timetable is unknown — and compared by what a decision
depends on: demands, gangs, constraints, nodes with their totals and idle state, because
Ray's own resource-state version moves on every usage report), and returns as soon as
any of them changes or a decision falls due by time alone (`workflows/deadlines.py`: an
idle pod's expiry, say). The tick (`tick_s`, minutes) is only a safety net, so an idle
cluster costs a few activities an hour.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Iterable
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    FailureError,
    WorkflowAlreadyStartedError,
)
from temporalio.workflow import ActivityCancellationType, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from raysize.workflows import telemetry
    from raysize.workflows.contracts import (
        Act,
        Decision,
        DrainedPod,
        DrainInput,
        DrainResult,
        DrainTarget,
        Err,
        EventInput,
        Observation,
        ObserveInput,
        ReconcileInput,
        ReconcileStatus,
        ResizeRequest,
        ScaleInput,
        WaitInput,
    )
    from raysize.workflows.deadlines import (
        GrowWatch,
        drifting,
        next_decision_in,
        outside_ippr,
        stuck_resizes,
    )
    from raysize.workflows.model import (
        ClusterSnapshot,
        LaunchAction,
        Plan,
        PlannerSettings,
        ResizeAction,
        TerminateAction,
    )
    from raysize.workflows.naming import (
        RECONCILE_WORKFLOW,
        resize_search_attributes,
        resize_workflow_id,
    )
    from raysize.workflows.planner import (
        landing_grows,
        pending_gpu_pods,
        plan,
        silent_pending_pods,
    )
    from raysize.workflows.resize_workflow import PodResizeWorkflow
    from raysize.workflows.resources import CPU, MEMORY, Resources, units_to_float
    from raysize.workflows.summaries import resize_details, resize_summary
    from raysize.workflows.versioning import ON_CONTINUE_AS_NEW, upgrade_due, watch_for_upgrade
    from raysize.workflows.waiting import raise_if_cancelled, until_done_or

KEEP_DECISIONS = 50


def scale_request(obs: Observation, p: Plan) -> tuple[dict[str, int], dict[str, tuple[str, ...]]]:
    """Absolute replicas per group and who to delete: current spec plus the plan. A pod
    not created yet (no UID) lowers its group's replicas without a name; the others are
    named, and `Kube.scale` lowers replicas by exactly the named pods that still exist."""
    replicas = dict(obs.replicas)
    to_delete: dict[str, list[str]] = {}
    created = {x.name for x in obs.snapshot.pods if x.uid} if obs.snapshot else set()
    for action in p.launch:
        replicas[action.group] = replicas.get(action.group, 0) + action.count
    for t in p.terminate:
        replicas[t.group] = max(0, replicas.get(t.group, 0) - 1)
        if t.pod in created or obs.snapshot is None:
            to_delete.setdefault(t.group, []).append(t.pod)
    return replicas, {g: tuple(sorted(names)) for g, names in to_delete.items()}


def clamp_launches(
    snapshot: ClusterSnapshot, p: Plan, kept: Iterable[str]
) -> tuple[LaunchAction, ...]:
    """The plan's launches less those that only fit under a group's maximum because a pod
    would go that Ray refused to drain (the pod stays, so its place is not free)."""
    groups = {x.name: x.group for x in snapshot.pods}
    staying: dict[str, int] = {}
    for name in kept:
        staying[groups.get(name, "")] = staying.get(groups.get(name, ""), 0) + 1
    if not staying:
        return p.launch
    removed: dict[str, int] = {}
    for t in p.terminate:
        removed[t.group] = removed.get(t.group, 0) + 1
    count = {g: 0 for g in snapshot.groups}
    for x in snapshot.pods:
        count[x.group] = count.get(x.group, 0) + 1
    out: list[LaunchAction] = []
    for a in p.launch:
        cap = snapshot.groups[a.group].max_workers if a.group in snapshot.groups else None
        n = a.count
        if cap is not None and staying.get(a.group):
            after = count.get(a.group, 0) - removed.get(a.group, 0) + staying[a.group]
            n = max(0, min(a.count, cap - after))
        if n:
            out.append(a.model_copy(update={"count": n}))
    return tuple(out)


def describe_plan(p: Plan, *, scaling: bool = True) -> list[str]:
    """One line per decision of the plan; the launches and removals only with `scaling`
    (they did not happen when the RayCluster could not be changed)."""
    lines = [f"launch {a.count} × {a.group}: {a.reason}" for a in p.launch] if scaling else []
    for r in p.resize:
        lines.append(f"{'shrink' if r.shrinks else 'grow'} {r.pod}: {r.reason}")
    if scaling:
        lines += [f"remove {t.pod}: {t.reason}" for t in p.terminate]
    return lines


# workflow.patched() ids: a change to what a workflow does is taken only by runs that reach
# it after the change; runs in flight replay their history as they recorded it
ABANDON_WAIT_PATCH = "reconcile-wait-abandon"
# runs that reach a stuck resize (no saga left on it) after this change settle it
SETTLE_PATCH = "reconcile-settle-stuck"
# a planned resize that grows a resize in flight further (`ResizeAction.retarget`) goes to
# the running saga (`retarget`) instead of being skipped; older runs keep skipping it
RETARGET_IN_FLIGHT_PATCH = "reconcile-retarget-in-flight"
# no pod is launched for demand while a grow lands (`planner.landing_grows`); older runs
# launched, and replay so
HOLD_WHILE_LANDING_PATCH = "reconcile-hold-launch-while-landing"
# work without GPUs may use a pending GPU pod's spare room once GPU work has had its pick
# (`plan(spare_pending_gpu=...)`); older runs kept it to the last stage, and replay so
SPARE_PENDING_GPU_PATCH = "reconcile-spare-pending-gpu"
# no pod is launched for demand for a moment after a grow landed either (`GrowWatch`,
# `plan(just_grown=...)`): Ray may still report the work it took; older runs launched
HOLD_AFTER_GROW_PATCH = "reconcile-hold-after-grow"
# scale-in drains first (`drain_raylets`): a pod is named for deletion only once Ray
# accepted its drain, a drained pod is removed even after a crash (`ReconcileCarry.drained`),
# stale names leave workersToDelete, and a pause mid-tick stops the tick's other actions;
# older runs named idle pods at once, and replay so
DRAIN_FIRST_PATCH = "reconcile-drain-first"
# runs that reach a pod of a group ray.io/ippr does not name with a resize in flight or a
# Raylet apart from its pod (`deadlines.outside_ippr`) after this change leave it alone;
# older runs settled it (the head with num-cpus "0", issue #26), and replay so
RESPECT_IPPR_PATCH = "reconcile-only-ippr-groups"
# runs that reach a pod Kubernetes has run past the Raylet start timeout with no Raylet
# (`planner.silent_pending_pods`) after this change replace it (`plan(replace_silent_
# pending=...)`); older runs waited on it for good, and replay so
REPLACE_SILENT_PENDING_PATCH = "reconcile-replace-silent-pending"
# a grow in flight taken further (`ResizeAction.retarget`) is only signalled to its saga,
# never started anew: a saga that ended since the observe leaves it to the next tick;
# older runs tried a start first, and replay so
RETARGET_SIGNAL_ONLY_PATCH = "reconcile-retarget-signal-only"


@workflow.defn(name=RECONCILE_WORKFLOW)
class ReconcileWorkflow:
    @workflow.init
    def __init__(self, inp: ReconcileInput) -> None:
        # state from the input is set here, before any signal of the first task runs
        self.inp: ReconcileInput | None = inp
        self.carry = inp.carry
        self.paused = inp.carry.paused
        self.woken = False
        self.last_plan: Plan | None = None
        self.last_error = ""
        self.decisions: list[Decision] = list(inp.carry.decisions)
        # seconds from the last observe until a decision falls due with nothing changing
        self.next_decision_in: float | None = None
        self.pods: tuple[str, ...] | None = None  # at the last observe that read them
        self.drift_since: dict[str, float] = {}  # pod → when its Raylet was seen differ
        self.grows = GrowWatch()  # the grows this run started, until just after they land

    @workflow.signal
    def pause(self) -> None:
        self.paused = True
        self.woken = True

    @workflow.signal
    def resume(self) -> None:
        self.paused = False
        self.woken = True

    @workflow.signal
    def wake(self) -> None:
        """Reconcile now instead of at the next change or tick."""
        self.woken = True

    @workflow.query
    def status(self) -> ReconcileStatus:
        inp = self.inp
        return ReconcileStatus(
            namespace=inp.namespace if inp else "",
            cluster=inp.cluster if inp else "",
            paused=self.paused,
            ticks=self.carry.ticks,
            last_plan=self.last_plan,
            config_errors=self.carry.config_errors,
            decisions=tuple(self.decisions),
            resizes_started=self.carry.resizes_started,
            last_error=self.last_error,
            stood_down=self.carry.stood_down,
            ray_autoscaler_pod=self.carry.ray_autoscaler_pod,
            pods=self.pods,
        )

    @workflow.run
    async def run(self, inp: ReconcileInput) -> str:
        ticks_this_run = 0
        watch_for_upgrade(self.wake)  # a new current version ends the wait (versioning.py)
        while True:
            if self.paused:
                await workflow.wait_condition(lambda: not self.paused)
            self.woken = False
            self.next_decision_in = None
            obs = await self._observe(inp)
            if obs is not None and not obs.found:
                workflow.logger.info("RayCluster %s/%s is gone: done", inp.namespace, inp.cluster)
                return "RayCluster deleted"
            if obs is not None and not self.paused:
                with telemetry.decision_scope():
                    await self._reconcile(inp, obs)
            self.carry = self.carry.model_copy(update={"ticks": self.carry.ticks + 1})
            ticks_this_run += 1
            if (
                workflow.info().is_continue_as_new_suggested()
                or ticks_this_run >= inp.max_ticks_per_run
                or upgrade_due()  # to the new current version (workflows/versioning.py)
            ):
                carry = self.carry.model_copy(
                    update={"paused": self.paused, "decisions": tuple(self.decisions)}
                )
                workflow.continue_as_new(
                    inp.model_copy(update={"carry": carry}),
                    initial_versioning_behavior=ON_CONTINUE_AS_NEW,
                )
            await self._wait(inp, obs)

    # --- observe ------------------------------------------------------------------------
    async def _observe(self, inp: ReconcileInput) -> Observation | None:
        try:
            obs: Observation = await workflow.execute_activity(
                Act.OBSERVE,
                ObserveInput(
                    namespace=inp.namespace, cluster=inp.cluster, gcs_address=inp.gcs_address
                ),
                result_type=Observation,
                summary=f"read RayCluster {inp.namespace}/{inp.cluster}, its pods and Ray",
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(
                    maximum_attempts=3,
                    initial_interval=timedelta(milliseconds=200),
                    non_retryable_error_types=[Err.FORBIDDEN, Err.RAY_AUTH],
                ),
            )
        except ActivityError as exc:
            raise_if_cancelled(exc)
            # a failed read is "unknown", never "nothing": no action this tick
            self.last_error = f"observe failed, no action this tick: {_message(exc)}"
            workflow.logger.warning("%s/%s: %s", inp.namespace, inp.cluster, self.last_error)
            return None
        self.last_error = ""
        return obs

    # --- decide and act --------------------------------------------------------------------
    async def _reconcile(self, inp: ReconcileInput, obs: Observation) -> None:
        # two autoscalers on one cluster would undo each other's work: while Ray's own
        # runs beside the head, raysize only watches; the pods' ray.io/ippr-status is the
        # state either one picks up from the other. The flag off is not enough: KubeRay
        # does not restart a running head, so Ray's sidecar may still run in it
        sidecar = "" if obs.in_tree_autoscaling else obs.ray_autoscaler_pod
        stand_by = obs.in_tree_autoscaling or bool(sidecar)
        if stand_by != self.carry.stood_down or sidecar != self.carry.ray_autoscaler_pod:
            self.carry = self.carry.model_copy(
                update={"stood_down": stand_by, "ray_autoscaler_pod": sidecar}
            )
            if obs.in_tree_autoscaling:
                await self._event(
                    inp,
                    "InTreeAutoscaling",
                    "raysize takes no action: Ray's in-tree autoscaler owns this cluster "
                    "(spec.enableInTreeAutoscaling: true); set it to false to hand the "
                    "cluster to raysize",
                )
            elif sidecar:
                await self._event(
                    inp,
                    "RayAutoscalerRunning",
                    "raysize takes no action yet: spec.enableInTreeAutoscaling is false, but "
                    f"Ray's autoscaler still runs in head pod {sidecar} (container "
                    "autoscaler): KubeRay does not restart a running head when the flag "
                    "changes. Restart the head pod or stop that container; raysize then "
                    "takes over from the pods' ray.io/ippr-status",
                    warning=True,
                )
            else:
                await self._event(
                    inp,
                    "ManagedByRaysize",
                    "spec.enableInTreeAutoscaling is off: raysize manages this cluster, "
                    "carrying on from the pods' ray.io/ippr-status",
                )
        if obs.snapshot is not None:
            self.pods = tuple(p.name for p in obs.snapshot.pods)
        if stand_by:
            return
        errors = tuple(str(e) for e in obs.config_errors)
        if errors != self.carry.config_errors:
            self.carry = self.carry.model_copy(update={"config_errors": errors})
            if errors:
                await self._event(
                    inp,
                    "InvalidIPPRConfig",
                    "raysize takes no action until ray.io/ippr is fixed: " + "; ".join(errors),
                    warning=True,
                )
            else:
                await self._event(inp, "IPPRConfigValid", "ray.io/ippr is valid again")
        if errors or obs.snapshot is None:
            return
        snapshot = obs.snapshot.model_copy(
            update={"settings": _merge_settings(inp.settings, obs.snapshot.settings)}
        )
        snapshot = self._still_drained(snapshot)
        # since when each pod's Raylet has differed from its pod (this run's clock)
        now = workflow.now().timestamp()
        ippr_only = not outside_ippr(snapshot) or workflow.patched(RESPECT_IPPR_PATCH)
        self.drift_since = {
            n: self.drift_since.get(n, now) for n in drifting(snapshot, ippr_only=ippr_only)
        }
        drift_s = {n: now - t for n, t in self.drift_since.items()}
        self.next_decision_in = next_decision_in(snapshot, drift_s, ippr_only=ippr_only)
        seen = telemetry.demand_seen_at(self.carry.demand_seen_at, snapshot)
        if seen != self.carry.demand_seen_at:
            self.carry = self.carry.model_copy(update={"demand_seen_at": seen})
        planner = plan
        if landing_grows(snapshot) and not workflow.patched(HOLD_WHILE_LANDING_PATCH):
            planner = functools.partial(planner, hold_while_landing=False)
        if pending_gpu_pods(snapshot) and not workflow.patched(SPARE_PENDING_GPU_PATCH):
            planner = functools.partial(planner, spare_pending_gpu=False)
        if silent_pending_pods(snapshot) and not workflow.patched(REPLACE_SILENT_PENDING_PATCH):
            planner = functools.partial(planner, replace_silent_pending=False)
        just_grown = self.grows.observe(snapshot, obs.resizing, now)
        if just_grown and workflow.patched(HOLD_AFTER_GROW_PATCH):
            planner = functools.partial(planner, just_grown=just_grown)
            due = self.grows.due_in(now)
            if due is not None:
                self.next_decision_in = min(self.next_decision_in or due, due)
        p = telemetry.timed_plan(planner, snapshot, inp.cluster, inp.namespace)
        self.last_plan = p
        stuck = stuck_resizes(snapshot, drift_s, ippr_only=ippr_only)
        if stuck and workflow.patched(SETTLE_PATCH) and not self._halted():
            await self._settle(inp, snapshot, stuck)
        prune = bool(obs.stale_to_delete) and workflow.patched(DRAIN_FIRST_PATCH)
        if p.is_empty and not (self.carry.drained or prune):
            return
        if not p.is_empty:
            telemetry.decision_span(inp.namespace, inp.cluster, self.carry.ticks, p)
        started = 0 if self._halted() else await self._start_resizes(inp, obs, p)
        self.carry = self.carry.model_copy(
            update={"resizes_started": self.carry.resizes_started + started}
        )
        acted: Plan = p
        kept: list[str] = []
        if self.carry.drained or (p.terminate and workflow.patched(DRAIN_FIRST_PATCH)):
            acted, kept = await self._drain_first(inp, obs, snapshot, p)
        if self._halted():
            # paused while this tick acted: nothing more of it, except the removal of pods
            # whose drain Ray accepted (a drained Raylet takes no work: its pod must go)
            acted = Plan(terminate=self._drained_removals())
            kept.append(f"paused: the rest of tick {self.carry.ticks}'s plan is not carried out")
        scaled = False
        if acted.launch or acted.terminate or prune:
            scaled = await self._scale(inp, obs, acted)
            if scaled:
                self.carry = self.carry.model_copy(update={"drained": ()})
            else:  # a conflict or a refusal: plan again on fresh state soon
                self.next_decision_in = min(self.next_decision_in or inp.retry_s, inp.retry_s)
        lines = describe_plan(acted, scaling=scaled or not (acted.launch or acted.terminate))
        lines += kept
        if lines:
            summary = f"tick {self.carry.ticks}: " + "; ".join(lines)
            self.decisions.append(
                Decision(tick=self.carry.ticks, summary=summary, reasons=tuple(lines))
            )
            del self.decisions[:-KEEP_DECISIONS]
            telemetry.log_decisions(
                inp.namespace, inp.cluster, self.carry.ticks, acted, scaled=scaled, kept=kept
            )
            await self._event(inp, "Reconciled", summary[:1000])

    def _halted(self) -> bool:
        """A pause arrived while this tick was acting: its remaining actions are dropped."""
        return self.paused and workflow.patched(DRAIN_FIRST_PATCH)

    def _still_drained(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """Forget drained pods that are gone or already named for deletion (the snapshot
        leaves those out), and take the rest out of the snapshot: they are leaving, their
        Raylets take no work, and the next write names them."""
        if not self.carry.drained:
            return snapshot
        uids = {x.name: x.uid for x in snapshot.pods}
        left = tuple(d for d in self.carry.drained if d.pod in uids and uids[d.pod] == d.uid)
        if left != self.carry.drained:
            self.carry = self.carry.model_copy(update={"drained": left})
        names = {d.pod for d in left}
        return snapshot.model_copy(
            update={"pods": tuple(x for x in snapshot.pods if x.name not in names)}
        )

    def _drained_removals(self) -> tuple[TerminateAction, ...]:
        return tuple(
            TerminateAction(pod=d.pod, group=d.group, reason=f"{d.reason}; Ray drained it")
            for d in self.carry.drained
        )

    async def _drain_first(
        self, inp: ReconcileInput, obs: Observation, snapshot: ClusterSnapshot, p: Plan
    ) -> tuple[Plan, list[str]]:
        """Scale-in as Ray's own autoscaler does it: a pod with a live Raylet is removed
        only if Ray accepts to drain it (a Raylet that runs work refuses, so nothing
        placed on it since the observe dies with it). A pod without one (never
        registered, dead, not created) needs no drain. Never a pod with a resize in
        flight, or one grown moments ago. Returns what to write, and why some stay."""
        pods = {x.name: x for x in snapshot.pods}
        busy = set(obs.resizing) | set(self.grows.growing) | set(self.grows.landed)
        stays: dict[str, str] = {}  # pod → why it is kept
        now: list[TerminateAction] = []
        targets: dict[str, TerminateAction] = {}
        for t in p.terminate:
            pod = pods.get(t.pod)
            if t.pod in busy:
                stays[t.pod] = "a resize of it is in flight or just landed"
            elif pod is None or not pod.raylet_id:
                now.append(t)  # no Raylet to drain: nothing can run there
            elif not self._halted():
                targets[t.pod] = t
        if targets:
            result = await self._drain(inp, obs, targets)
            for name, why in sorted(result.refused.items()):
                stays[name] = f"Ray refused to drain it ({why})"
            accepted = [targets[n] for n in result.accepted if n in targets]
            if accepted:
                self.carry = self.carry.model_copy(
                    update={
                        "drained": (
                            *self.carry.drained,
                            *(
                                DrainedPod(
                                    pod=t.pod, group=t.group, uid=pods[t.pod].uid, reason=t.reason
                                )
                                for t in accepted
                            ),
                        )
                    }
                )
        launch = clamp_launches(snapshot, p, stays)
        kept = [f"keep {name}: {why}" for name, why in stays.items()]
        return p.model_copy(
            update={"launch": launch, "terminate": (*now, *self._drained_removals())}
        ), kept

    async def _drain(
        self, inp: ReconcileInput, obs: Observation, targets: dict[str, TerminateAction]
    ) -> DrainResult:
        assert obs.snapshot is not None
        raylets = {x.name: x.raylet_id or "" for x in obs.snapshot.pods}
        try:
            result: DrainResult = await workflow.execute_activity(
                Act.DRAIN,
                DrainInput(
                    namespace=inp.namespace,
                    cluster=inp.cluster,
                    gcs_address=obs.gcs_address,
                    targets=tuple(
                        DrainTarget(pod=n, node_id=raylets[n], reason=f"raysize: {t.reason}")
                        for n, t in sorted(targets.items())
                    ),
                ),
                result_type=DrainResult,
                summary=f"drain {len(targets)} idle Raylet(s) before removing their pods: "
                + ", ".join(sorted(targets)),
                start_to_close_timeout=timedelta(seconds=30 + 10 * len(targets)),
                retry_policy=RetryPolicy(maximum_attempts=3),
            )
        except ActivityError as exc:
            raise_if_cancelled(exc)
            why = f"the drain could not be asked: {_message(exc)}"
            return DrainResult(refused={n: why for n in targets})
        return result

    async def _start_resizes(self, inp: ReconcileInput, obs: Observation, p: Plan) -> int:
        in_flight = set(obs.resizing)
        budget = max(0, inp.max_concurrent_resizes - len(in_flight))
        snapshot = obs.snapshot
        assert snapshot is not None
        pods = {x.name: x for x in snapshot.pods}
        # a grow in flight taken further goes to its saga: no new resize, outside the budget
        retargets = [r for r in p.resize if r.pod in in_flight and r.retarget]
        if retargets and not workflow.patched(RETARGET_IN_FLIGHT_PATCH):
            retargets = []
        todo: list[ResizeAction] = []
        for r in p.resize:
            if r.pod in in_flight:
                continue
            if len(todo) >= budget:
                self.decisions.append(
                    Decision(
                        tick=self.carry.ticks,
                        summary=f"held {len(p.resize) - len(todo)} resize(s): "
                        f"{inp.max_concurrent_resizes} already running",
                    )
                )
                break
            todo.append(r)
        # a grow in flight taken further is for its saga alone: if that saga ended since the
        # observe, the next tick plans on what it left (a new saga would act on a stale
        # decision); older runs tried a start first, and replay so
        signal_only = bool(retargets) and workflow.patched(RETARGET_SIGNAL_ONLY_PATCH)
        results = await asyncio.gather(
            *(
                self._start_one(
                    inp, r, pods[r.pod].raylet_id or "", snapshot, start=not signal_only
                )
                for r in retargets
            ),
            *(self._start_one(inp, r, pods[r.pod].raylet_id or "", snapshot) for r in todo),
        )
        return sum(results)

    async def _settle(
        self, inp: ReconcileInput, snapshot: ClusterSnapshot, stuck: tuple[ResizeAction, ...]
    ) -> None:
        """A saga for each resize nobody works on any more: back to the pod's actual size.
        Where a saga still runs (paused by an operator, say), it is left to finish."""
        pods = {x.name: x for x in snapshot.pods}
        for r in stuck:
            started = await self._start_one(
                inp, r, pods[r.pod].raylet_id or "", snapshot, retarget=False
            )
            if r.pod in self.drift_since:
                # the next look at this Raylet comes a whole RAYLET_DRIFT_S later: a sync
                # that could not take (its old node not yet dead in Ray, say) is not
                # retried in a loop
                self.drift_since[r.pod] = workflow.now().timestamp()
            if started:
                line = f"settle {r.pod}: {r.reason}"
                workflow.logger.warning("%s/%s: %s", inp.namespace, inp.cluster, line)
                self.decisions.append(Decision(tick=self.carry.ticks, summary=line))
                self.carry = self.carry.model_copy(
                    update={"resizes_started": self.carry.resizes_started + 1}
                )
                await self._event(inp, "SettlingStuckResize", line[:1000], warning=True)

    async def _start_one(
        self,
        inp: ReconcileInput,
        r: ResizeAction,
        node_id: str,
        snapshot: ClusterSnapshot,
        *,
        retarget: bool = True,
        start: bool = True,
    ) -> int:
        """Start the pod's resize saga, or (with `retarget`) send the new target to the
        one running; without `start`, only send it (a grow in flight taken further)."""
        ippr = snapshot.groups[r.group].ippr
        req = ResizeRequest(
            namespace=inp.namespace,
            cluster=inp.cluster,
            pod=r.pod,
            group=r.group,
            node_id=node_id,
            from_cpu=r.from_cpu,
            from_memory=r.from_memory,
            cpu=r.cpu,
            memory=r.memory,
            timeout_s=ippr.resize_timeout_s if ippr else 60,
            reason=r.reason,
            # the pod the plan saw: one created again under its name is not resized by it
            pod_uid=next((p.uid for p in snapshot.pods if p.name == r.pod), ""),
            poll_interval_s=inp.resize_poll_interval_s,
            poll_window_s=inp.resize_poll_window_s,
            demand_seen_at=self.carry.demand_seen_at
            if r.cpu > r.from_cpu or r.memory > r.from_memory
            else None,
        )
        wf_id = resize_workflow_id(inp.namespace, r.pod)
        if start:
            return await self._start_child(inp, r, req, wf_id, retarget=retarget)
        await self._send_retarget(inp, r, req, wf_id)
        return 0

    async def _start_child(
        self,
        inp: ReconcileInput,
        r: ResizeAction,
        req: ResizeRequest,
        wf_id: str,
        *,
        retarget: bool,
    ) -> int:
        try:
            await workflow.start_child_workflow(
                PodResizeWorkflow.run,
                req,
                id=wf_id,
                parent_close_policy=ParentClosePolicy.ABANDON,
                search_attributes=resize_search_attributes(req),
                static_summary=resize_summary(req),
                static_details=resize_details(req),
                memo={
                    "from": _size(r.from_cpu, r.from_memory),
                    "to": _size(r.cpu, r.memory),
                    "reason": r.reason,
                },
            )
            self.grows.started(r, workflow.now().timestamp())
            return 1
        except WorkflowAlreadyStartedError:
            if retarget:
                await self._send_retarget(inp, r, req, wf_id)
            return 0

    async def _send_retarget(
        self, inp: ReconcileInput, r: ResizeAction, req: ResizeRequest, wf_id: str
    ) -> None:
        try:
            await workflow.get_external_workflow_handle(wf_id).signal(
                PodResizeWorkflow.retarget, req
            )
        except FailureError as exc:
            # the saga ended between the start and the signal: this resize is a new one,
            # the next tick starts it on fresh state (a failed signal must never fail
            # the loop: the cluster would be unmanaged, an operator's pause lost)
            line = f"retarget of {r.pod} not sent: its resize ended meanwhile ({exc.message})"
            workflow.logger.info("%s/%s: %s", inp.namespace, inp.cluster, line)
            self.next_decision_in = min(self.next_decision_in or inp.retry_s, inp.retry_s)

    async def _scale(self, inp: ReconcileInput, obs: Observation, p: Plan) -> bool:
        replicas, to_delete = scale_request(obs, p)
        uids = {x.name: x.uid for x in obs.snapshot.pods} if obs.snapshot else {}
        uids.update({d.pod: d.uid for d in self.carry.drained})
        try:
            await workflow.execute_activity(
                Act.SCALE,
                ScaleInput(
                    namespace=inp.namespace,
                    cluster=inp.cluster,
                    replicas=replicas,
                    workers_to_delete=to_delete,
                    generation=obs.generation,
                    pod_uids={n: uids.get(n, "") for names in to_delete.values() for n in names},
                ),
                summary=_scale_summary(replicas, to_delete),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(
                    maximum_attempts=3,
                    # a conflict means our read is stale: plan again on fresh state
                    non_retryable_error_types=["Conflict", Err.FORBIDDEN, Err.INVALID],
                ),
            )
            return True
        except ActivityError as exc:
            raise_if_cancelled(exc)
            self.last_error = f"scaling skipped this tick: {_message(exc)}"
            return False

    async def _event(
        self, inp: ReconcileInput, reason: str, message: str, *, warning: bool = False
    ) -> None:
        try:
            await workflow.execute_activity(
                Act.EVENT,
                EventInput(
                    namespace=inp.namespace,
                    kind="RayCluster",
                    name=inp.cluster,
                    reason=reason,
                    message=message,
                    warning=warning,
                ),
                summary=f"Event {reason} on the RayCluster",
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=RetryPolicy(maximum_attempts=3),
            )
        except ActivityError as exc:  # an event is a courtesy: never block on it
            raise_if_cancelled(exc)
            workflow.logger.warning("event %s not recorded: %s", reason, _message(exc))

    # --- wait -----------------------------------------------------------------------------
    def _show(self, obs: Observation, timeout: float) -> None:
        """The Temporal UI's current details: what the loop last did and waits for."""
        if obs.in_tree_autoscaling:
            state = "standing by: Ray's in-tree autoscaler owns this cluster"
        elif self.carry.ray_autoscaler_pod:
            state = (
                "standing by: Ray's autoscaler still runs in head pod "
                f"{self.carry.ray_autoscaler_pod}"
            )
        elif obs.config_errors:
            state = "no action until ray.io/ippr is fixed: " + "; ".join(
                str(e) for e in obs.config_errors
            )
        else:
            last = self.decisions[-1].summary if self.decisions else "no action yet"
            state = f"last decision: {last}"
        when = workflow.now() + timedelta(seconds=timeout)
        workflow.set_current_details(
            f"{'PAUSED · ' if self.paused else ''}{state}\n\nwaiting for a change of the pods, "
            f"the RayCluster or Ray's demands, at most until {when:%H:%M:%S} UTC "
            f"({self.carry.resizes_started} resizes started, tick {self.carry.ticks})"
        )

    async def _wait(self, inp: ReconcileInput, obs: Observation | None) -> None:
        """Until something changes, a decision falls due, or the tick (a safety net)
        passes. An idle cluster thus costs an observe and a wait every `tick_s`
        (minutes), not every few seconds."""
        if self.woken:
            return
        if obs is None or not obs.gcs_address:
            # the read failed: try again soon, not after the long tick
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(lambda: self.woken, timeout=inp.retry_s)
            return
        # A signal that ends the wait (pause, resume, wake) abandons the watch instead of
        # asking the server to cancel it: a watch that completed at that very moment made
        # the cancel request fail the workflow task (ACTIVITY_UNKNOWN), and the loop stalled
        # until the task timed out. The abandoned watch ends by itself within the tick.
        # Runs recorded before this change asked for the cancel: they replay as they were.
        cancellation = (
            ActivityCancellationType.ABANDON
            if workflow.patched(ABANDON_WAIT_PATCH)
            else ActivityCancellationType.TRY_CANCEL
        )
        timeout = inp.tick_s
        if self.next_decision_in is not None:
            timeout = max(0.1, min(timeout, self.next_decision_in))
        self._show(obs, timeout)
        # Ray's demands matter only where raysize may act: a cluster with a config error,
        # or one Ray's own autoscaler owns, waits on Kubernetes alone (the fix of the
        # annotation, the hand-over) and costs its GCS nothing
        acting = not (obs.config_errors or obs.in_tree_autoscaling or obs.ray_autoscaler_pod)
        watch = workflow.start_activity(
            Act.WAIT_FOR_CHANGE,
            WaitInput(
                namespace=inp.namespace,
                cluster=inp.cluster,
                gcs_address=obs.gcs_address,
                gcs_version=obs.gcs_version,
                pods_version=obs.pods_version,
                timeout_s=timeout,
                cluster_mark=obs.cluster_mark,
                watch_ray=acting,
            ),
            summary=f"wait for a change, at most {timeout:.3g}s"
            + ("" if acting else " (Kubernetes only: raysize may not act)"),
            start_to_close_timeout=timedelta(seconds=timeout + 30),
            heartbeat_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(maximum_attempts=1),
            cancellation_type=cancellation,
        )
        await until_done_or(watch, lambda: self.woken)
        if watch.done() and watch.exception() is not None:
            # the watch failed (GCS restarting, the worker stopped): don't spin
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(lambda: self.woken, timeout=inp.retry_s)


def _scale_summary(replicas: dict[str, int], to_delete: dict[str, tuple[str, ...]]) -> str:
    text = "set replicas " + ", ".join(f"{g}={n}" for g, n in sorted(replicas.items()))
    removed = sum(len(names) for names in to_delete.values())
    return f"{text}; remove {removed} pod(s)" if removed else text


def _merge_settings(base: PlannerSettings, cluster: PlannerSettings) -> PlannerSettings:
    """The cluster's own autoscalerOptions win over the worker's defaults."""
    return base.model_copy(
        update={
            "idle_timeout_s": cluster.idle_timeout_s,
            "upscaling_mode": cluster.upscaling_mode,
            "max_workers": cluster.max_workers
            if cluster.max_workers is not None
            else base.max_workers,
        }
    )


def _size(cpu: int, memory: int) -> str:
    mem = Resources({MEMORY: memory}).to_k8s().get("memory", "0")
    return f"{units_to_float(cpu, CPU):g} CPU, {mem}"


def _message(exc: ActivityError) -> str:
    cause = exc.cause
    if isinstance(cause, ApplicationError):
        return cause.message
    return str(cause or exc)
