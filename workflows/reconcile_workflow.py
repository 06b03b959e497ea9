"""ReconcileWorkflow (`reconcile/<namespace>/<cluster>`): observe → plan → act → wait.

One per RayCluster. Observing and acting are activities. The plan is made inside the
observe activity (`workflows/decide.py`, pure) from what it read and what this loop
remembers (`Memory`, given with each observe and handed back updated), and recorded in
its result: a replay reads the decision, never makes it again, and the snapshot it was
made from stays out of the history.
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
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import NoReturn

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
    from pydantic import ValidationError

    from raysize.workflows import telemetry
    from raysize.workflows.contracts import (
        HEARTBEAT_TIMEOUT,
        OBSERVE_ONLY_VAR,
        WAIT_HEARTBEAT_TIMEOUT,
        Act,
        Decision,
        DrainedPod,
        DrainInput,
        DrainResult,
        DrainTarget,
        Err,
        EventInput,
        GcsTimetable,
        LoopSettings,
        Memory,
        ObserveInput,
        PodRef,
        ReconcileInput,
        ReconcileStatus,
        ResizeOutcome,
        ResizeRequest,
        ResizeSagaState,
        ScaleInput,
        Tick,
        WaitInput,
        WaitResult,
        WouldDo,
    )
    from raysize.workflows.model import (
        LaunchAction,
        Plan,
        ResizeAction,
        TerminateAction,
    )
    from raysize.workflows.naming import (
        RECONCILE_WORKFLOW,
        resize_search_attributes,
        resize_workflow_id,
    )
    from raysize.workflows.resize_workflow import PodResizeWorkflow
    from raysize.workflows.resources import CPU, MEMORY, Resources, size_text, units_to_float
    from raysize.workflows.summaries import resize_details, resize_summary
    from raysize.workflows.versioning import ON_CONTINUE_AS_NEW, upgrade_due
    from raysize.workflows.waiting import backoff_s, raise_if_cancelled, until_done_or

KEEP_DECISIONS = 50
# how long after a saga moved a pod away from a size a read that shows the pod at that
# size again is taken as one that missed the saga's write (a pod cache that has not
# received it yet: the other worker made the patch), not as news: longer than a pod
# watch may lag (activities/pod_watch.py's silence bound is 45 s)
STALE_WRITE_S = 60.0
# a local activity's retry due later than this waits on a workflow timer, not in its task
LOCAL_RETRY_THRESHOLD = timedelta(seconds=1)
# a decision keeps its first lines (status, the carry over continue-as-new); the log line of
# each decision (`telemetry.log_decisions`) has every one. 50 decisions of 100 grows each
# would carry over a megabyte into each new run
KEEP_REASONS = 20


def _below(size: tuple[int, int], target: tuple[int, int] | None) -> bool:
    """Is `size` below `target` in a dimension (None: no target known)?"""
    return target is not None and (size[0] < target[0] or size[1] < target[1])


def _first(lines: list[str], n: int) -> list[str]:
    if len(lines) <= n:
        return lines
    return [*lines[:n], f"… and {len(lines) - n} more (every one is in the decision log)"]


def scale_request(
    tick: Tick, p: Plan, drained: Iterable[DrainedPod] = ()
) -> tuple[dict[str, int], dict[str, tuple[str, ...]]]:
    """Absolute replicas per group and who to delete: current spec plus the plan. A pod
    not created yet (no UID) lowers its group's replicas without a name; the others are
    named, and `Kube.scale` lowers replicas by exactly the named pods that still exist."""
    replicas = dict(tick.replicas)
    to_delete: dict[str, list[str]] = {}
    created = {n for n, ref in tick.refs.items() if ref.uid} | {d.pod for d in drained if d.uid}
    for action in p.launch:
        replicas[action.group] = replicas.get(action.group, 0) + action.count
    for t in p.terminate:
        replicas[t.group] = max(0, replicas.get(t.group, 0) - 1)
        if t.pod in created:
            to_delete.setdefault(t.group, []).append(t.pod)
    return replicas, {g: tuple(sorted(names)) for g, names in to_delete.items()}


def clamp_launches(tick: Tick, p: Plan, kept: Iterable[str]) -> tuple[LaunchAction, ...]:
    """The plan's launches less those that only fit under a group's maximum because a pod
    would go that Ray refused to drain (the pod stays, so its place is not free)."""
    groups = tick.groups
    staying: dict[str, int] = {}
    for name in kept:
        ref = tick.refs.get(name)
        g = ref.group if ref is not None else ""
        staying[g] = staying.get(g, 0) + 1
    if not staying:
        return p.launch
    removed: dict[str, int] = {}
    for t in p.terminate:
        removed[t.group] = removed.get(t.group, 0) + 1
    out: list[LaunchAction] = []
    for a in p.launch:
        group = groups.get(a.group)
        cap = group.max_workers if group is not None else None
        n = a.count
        if cap is not None and group is not None and staying.get(a.group):
            after = group.pods - removed.get(a.group, 0) + staying[a.group]
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


def follow(inp: ReconcileInput, worker: LoopSettings) -> ReconcileInput:
    """The loop's input with the worker's settings as the tick recorded them (issue #43
    item 5); each change is logged once, when the loop takes it."""
    now = inp.loop
    if worker == now:
        return inp
    changes = changed_settings(now, worker)
    workflow.logger.info(
        "%s/%s: the worker's settings changed, in force from this tick: %s",
        inp.namespace,
        inp.cluster,
        ", ".join(changes),
    )
    return inp.with_loop(worker)


def changed_settings(old: LoopSettings, new: LoopSettings) -> list[str]:
    """`name old → new` for each setting that differs."""
    a = {**old.model_dump(exclude={"settings"}), **old.settings.model_dump()}
    b = {**new.model_dump(exclude={"settings"}), **new.settings.model_dump()}
    return [f"{k} {a.get(k)} → {b[k]}" for k in b if a.get(k) != b[k]]


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
        self.would: tuple[str, ...] = ()  # observe-only: what the last plan would have done
        # the wait before the next observe after a failed one (`_observe` sets it)
        self.retry_in = inp.retry_s
        self.watch_failures = 0  # waits failed in a row (a wait that returns resets it)
        # when the GCS publishes demands, as the last wait's worker knew it: handed to the
        # next wait, which may run on another worker that has not learned it
        self.gcs_timetable: GcsTimetable | None = None
        # pod → when the resize saga this run started for it ended (workflow time), and
        # when the last observe began: a decision about a pod whose saga ended after the
        # read began was made on what the saga has since changed (`_fresh`)
        self.saga_ends: dict[str, float] = {}
        self.observe_began = 0.0
        # pods whose saga this run started and whose end has not reached it yet (under
        # load the end may come tasks after the saga closed): never started again
        self.sagas_running: set[str] = set()
        # pods whose saga this run started (a grow in `Memory.growing` that is not one of
        # them was started by an earlier run: `_missed_write`)
        self.started_here: set[str] = set()
        self.noting: set[asyncio.Future[None]] = set()  # the tasks that wait for them
        # pod → the size this run last sent its saga as a new target (`_send_retarget`):
        # a saga that ends short of it wakes the loop (`_note_end`)
        self.sent_targets: dict[str, tuple[int, int]] = {}
        # pod → the target of the saga this run runs for it (at its start, then each new
        # target sent): a plan that did not see that saga does not lower it
        self.saga_targets: dict[str, tuple[int, int]] = {}

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
            observe_only=self.carry.observe_only,
            would=self.would,
            observe_failures=self.carry.observe_failures,
            in_force=None if inp is None else inp.loop,
        )

    @workflow.run
    async def run(self, inp: ReconcileInput) -> str:
        ticks_this_run = 0
        while True:
            if self.paused:
                # a paused loop moves to a new current version too (still paused): the
                # workers of that version wake it until it does (worker/deployment.py)
                await workflow.wait_condition(lambda: not self.paused or upgrade_due())
                if self.paused:
                    self._continue_as_new(inp)
            self.woken = False
            self.next_decision_in = None
            tick = await self._observe(inp)
            if tick is not None and tick.in_force is not None and inp.follow_worker:
                inp = self.inp = follow(inp, tick.in_force)
            if tick is not None and not tick.found:
                workflow.logger.info("RayCluster %s/%s is gone: done", inp.namespace, inp.cluster)
                return "RayCluster deleted"
            if tick is not None and not self.paused:
                with telemetry.decision_scope():
                    await self._reconcile(inp, tick)
            self.carry = self.carry.model_copy(update={"ticks": self.carry.ticks + 1})
            ticks_this_run += 1
            if (
                workflow.info().is_continue_as_new_suggested()
                or ticks_this_run >= inp.max_ticks_per_run
                or upgrade_due()  # to the new current version (workflows/versioning.py)
            ):
                if not upgrade_due():
                    # the next run's first observe comes after a wait, as every tick's
                    # does: without it a run of one tick observed again at once, and, the
                    # observe a local activity, a loop of such runs never left its
                    # workflow task. A new version is moved to at once
                    await self._wait(inp, tick)
                self._continue_as_new(inp)
            await self._wait(inp, tick)

    def _continue_as_new(self, inp: ReconcileInput) -> NoReturn:
        carry = self.carry.model_copy(
            update={"paused": self.paused, "decisions": tuple(self.decisions)}
        )
        workflow.continue_as_new(
            inp.model_copy(update={"carry": carry}),
            initial_versioning_behavior=ON_CONTINUE_AS_NEW,
        )

    @property
    def memory(self) -> Memory:
        return self.carry.memory

    def _decided(self, summary: str, reasons: tuple[str, ...] = ()) -> None:
        """Add a decision to those the status query shows (the newest KEEP_DECISIONS)."""
        self.decisions.append(Decision(tick=self.carry.ticks, summary=summary, reasons=reasons))
        del self.decisions[:-KEEP_DECISIONS]

    def _remember(self, **update: object) -> None:
        self.carry = self.carry.model_copy(
            update={"memory": self.carry.memory.model_copy(update=update)}
        )

    # --- observe and plan -------------------------------------------------------------------
    async def _observe(self, inp: ReconcileInput) -> Tick | None:
        self.observe_began = workflow.now().timestamp()
        # an end before this read began is in what it reads
        self.saga_ends = {p: t for p, t in self.saga_ends.items() if t >= self.observe_began}
        try:
            # a local activity: it runs in the workflow task that decided to observe, so the
            # tick is planned, and acted on, in that same task; a separate activity cost a
            # second workflow task and an activity task per tick (in a 1,000-cluster
            # burst the dev server was the machine's busiest process, bound by tasks per
            # second). A worker killed meanwhile: the task times out (10 s) and another
            # worker runs it, the read too
            tick: Tick = await workflow.execute_local_activity(
                Act.OBSERVE,
                ObserveInput(
                    namespace=inp.namespace,
                    cluster=inp.cluster,
                    gcs_address=inp.gcs_address,
                    settings=inp.settings,
                    memory=self.memory,
                    now=workflow.now().timestamp(),
                    max_resizes=inp.max_concurrent_resizes,
                    follow_worker=inp.follow_worker,
                ),
                result_type=Tick,
                summary=f"read RayCluster {inp.namespace}/{inp.cluster}, its pods and Ray; plan",
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(
                    maximum_attempts=3,
                    initial_interval=timedelta(milliseconds=200),
                    non_retryable_error_types=[Err.FORBIDDEN, Err.RAY_AUTH],
                ),
                # a retry due later (a throttled server's Retry-After) waits on a timer,
                # after this task: slept in the task, it held queries and signals
                local_retry_threshold=LOCAL_RETRY_THRESHOLD,
            )
        except FailureError as exc:  # a local activity's failure is its cause itself
            raise_if_cancelled(exc)
            # a failed read is "unknown", never "nothing": no action this tick
            failures = self.carry.observe_failures + 1
            self.carry = self.carry.model_copy(update={"observe_failures": failures})
            # longer after each failure in a row, jittered (one API server down for every
            # loop must not see them all retry together), never before the server's
            # Retry-After (a throttled read: the failure's next_retry_delay)
            self.retry_in = max(
                backoff_s(inp.retry_s, failures, inp.retry_max_s, workflow.random().random()),
                _retry_after(exc),
            )
            self.last_error = (
                f"observe failed {failures} time{'s' if failures > 1 else ''} in a row, next "
                f"try in {self.retry_in:.1f} s; no action this tick: {_message(exc)}"
            )
            workflow.logger.warning("%s/%s: %s", inp.namespace, inp.cluster, self.last_error)
            return None
        self.last_error = ""
        if self.carry.observe_failures:
            self.carry = self.carry.model_copy(update={"observe_failures": 0})
        return tick

    # --- act ---------------------------------------------------------------------------------
    async def _reconcile(self, inp: ReconcileInput, tick: Tick) -> None:
        if tick.observe_only != self.carry.observe_only:
            self.carry = self.carry.model_copy(update={"observe_only": tick.observe_only})
            await self._observe_only_changed(inp, tick)
        # two autoscalers on one cluster would undo each other's work: while Ray's own
        # runs beside the head, raysize only watches; the pods' ray.io/ippr-status is the
        # state either one picks up from the other. The flag off is not enough: KubeRay
        # does not restart a running head, so Ray's sidecar may still run in it
        sidecar = tick.ray_autoscaler_pod
        stand_by = tick.ray_autoscaler_acts
        if stand_by != self.carry.stood_down or sidecar != self.carry.ray_autoscaler_pod:
            self.carry = self.carry.model_copy(
                update={"stood_down": stand_by, "ray_autoscaler_pod": sidecar}
            )
            await self._stand_by_event(inp, tick)
        if tick.read_ray:
            self.pods = tick.pods
        if stand_by and not tick.observe_only:  # observe-only plans beside it, to compare
            return
        errors = tuple(str(e) for e in tick.config_errors)
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
        self.would = ()
        if tick.would is not None:
            await self._would(inp, tick, tick.would)
        if tick.plan is None or tick.observe_only:
            return  # observe-only: never act, whatever the tick holds
        p = tick.plan
        self._adopt_memory(tick)
        self._forget_old_moves()
        self.next_decision_in = tick.next_decision_in
        self.last_plan = p
        if tick.stuck and not self.paused:
            await self._settle(inp, tick)
        prune = bool(tick.stale_to_delete)
        if p.is_empty and not (self.memory.drained or prune):
            return
        if not p.is_empty:
            telemetry.decision_span(inp.namespace, inp.cluster, self.carry.ticks, p)
        started = 0 if self.paused else await self._start_resizes(inp, tick, p)
        self.carry = self.carry.model_copy(
            update={"resizes_started": self.carry.resizes_started + started}
        )
        acted: Plan = p
        kept: list[str] = []
        if self.memory.drained or p.terminate:
            acted, kept = await self._drain_first(inp, tick, p)
        if self.paused:
            # paused while this tick acted: nothing more of it, except the removal of pods
            # whose drain Ray accepted (a drained Raylet takes no work: its pod must go)
            acted = Plan(terminate=self._drained_removals())
            kept.append(f"paused: the rest of tick {self.carry.ticks}'s plan is not carried out")
        scaled = False
        if acted.launch or acted.terminate or prune:
            scaled = await self._scale(inp, tick, acted)
            if scaled:
                self._remember(drained=())
            else:  # a conflict or a refusal: plan again on fresh state soon
                self.next_decision_in = min(self.next_decision_in or inp.retry_s, inp.retry_s)
        lines = describe_plan(acted, scaling=scaled or not (acted.launch or acted.terminate))
        lines += kept
        if lines:
            shown = _first(lines, KEEP_REASONS)
            summary = f"tick {self.carry.ticks}: " + "; ".join(shown)
            self._decided(summary, tuple(shown))
            telemetry.log_decisions(
                inp.namespace, inp.cluster, self.carry.ticks, acted, scaled=scaled, kept=kept
            )
            await self._event(inp, "Reconciled", summary[:1000])

    async def _observe_only_changed(self, inp: ReconcileInput, tick: Tick) -> None:
        """The worker that observed was started with, or without, RAYSIZE_OBSERVE_ONLY:
        say so in the log, the decisions and an Event. Resizes already running are sagas
        of their own: they finish, or roll back, as they would have (their activities
        let a saga started before observe-only go on), so no resize is left half-done."""
        if tick.observe_only:
            reason = "ObserveOnly"
            line = (
                f"observe-only ({OBSERVE_ONLY_VAR}=true): raysize plans and says what it "
                "would do (Would* Events), and changes no pod, Raylet or RayCluster"
            )
            if tick.resizing:
                line += (
                    f"; the resizes in flight ({', '.join(tick.resizing)}) finish or roll "
                    "back as usual"
                )
        else:
            reason = "ObserveOnlyEnded"
            line = f"observe-only is off ({OBSERVE_ONLY_VAR} not set): raysize acts on its plans"
        workflow.logger.warning("%s/%s: %s", inp.namespace, inp.cluster, line)
        self._decided(line)
        await self._event(inp, reason, line[:1000])

    async def _would(self, inp: ReconcileInput, tick: Tick, would: WouldDo) -> None:
        """Observe-only: record what the plan would have done, as a decision and Events
        (only what was not said before: an unchanged plan is said once), and change
        nothing."""
        self._adopt_memory(tick)
        self.next_decision_in = tick.next_decision_in
        self.last_plan = would.plan
        self.would = would.lines
        if not would.events:
            return
        shown = _first(list(would.lines), KEEP_REASONS)
        summary = f"tick {self.carry.ticks}, observe-only (nothing was changed): " + "; ".join(
            shown
        )
        self._decided(summary, tuple(shown))
        for line in would.lines:
            workflow.logger.info("%s/%s: observe-only: %s", inp.namespace, inp.cluster, line)
        for e in would.events:
            await self._event(inp, e.reason, e.message)

    async def _stand_by_event(self, inp: ReconcileInput, tick: Tick) -> None:
        if tick.in_tree_autoscaling:
            await self._event(
                inp,
                "InTreeAutoscaling",
                "raysize takes no action: Ray's in-tree autoscaler owns this cluster "
                "(spec.enableInTreeAutoscaling: true); set it to false to hand the "
                "cluster to raysize",
            )
        elif tick.ray_autoscaler_pod:
            await self._event(
                inp,
                "RayAutoscalerRunning",
                "raysize takes no action yet: spec.enableInTreeAutoscaling is false, but "
                f"Ray's autoscaler still runs in head pod {tick.ray_autoscaler_pod} (container "
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

    def _drained_removals(self) -> tuple[TerminateAction, ...]:
        return tuple(
            TerminateAction(pod=d.pod, group=d.group, reason=f"{d.reason}; Ray drained it")
            for d in self.memory.drained
        )

    async def _drain_first(
        self, inp: ReconcileInput, tick: Tick, p: Plan
    ) -> tuple[Plan, list[str]]:
        """Scale-in as Ray's own autoscaler does it: a pod with a live Raylet is removed
        only if Ray accepts to drain it (a Raylet that runs work refuses, so nothing
        placed on it since the observe dies with it). A pod without one (never
        registered, dead, not created) needs no drain. Never a pod with a resize in
        flight, or one grown moments ago. Returns what to write, and why some stay."""
        busy = set(tick.resizing) | set(self.memory.growing) | set(self.memory.landed)
        stays: dict[str, str] = {}  # pod → why it is kept
        now: list[TerminateAction] = []
        targets: dict[str, TerminateAction] = {}
        for t in p.terminate:
            ref = tick.refs.get(t.pod)
            if t.pod in busy:
                stays[t.pod] = "a resize of it is in flight or just landed"
            elif ref is None or not ref.raylet_id:
                now.append(t)  # no Raylet to drain: nothing can run there
            elif not self.paused:
                targets[t.pod] = t
        if targets:
            result = await self._drain(inp, tick, targets)
            for name, why in sorted(result.refused.items()):
                stays[name] = f"Ray refused to drain it ({why})"
            accepted = [targets[n] for n in result.accepted if n in targets]
            if accepted:
                self._remember(
                    drained=(
                        *self.memory.drained,
                        *(
                            DrainedPod(
                                pod=t.pod, group=t.group, uid=tick.refs[t.pod].uid, reason=t.reason
                            )
                            for t in accepted
                        ),
                    )
                )
        launch = clamp_launches(tick, p, stays)
        kept = [f"keep {name}: {why}" for name, why in stays.items()]
        return p.model_copy(
            update={"launch": launch, "terminate": (*now, *self._drained_removals())}
        ), kept

    async def _drain(
        self, inp: ReconcileInput, tick: Tick, targets: dict[str, TerminateAction]
    ) -> DrainResult:
        try:
            result: DrainResult = await workflow.execute_activity(
                Act.DRAIN,
                DrainInput(
                    namespace=inp.namespace,
                    cluster=inp.cluster,
                    gcs_address=tick.gcs_address,
                    targets=tuple(
                        DrainTarget(
                            pod=n, node_id=tick.refs[n].raylet_id, reason=f"raysize: {t.reason}"
                        )
                        for n, t in sorted(targets.items())
                    ),
                ),
                result_type=DrainResult,
                summary=f"drain {len(targets)} idle Raylet(s) before removing their pods: "
                + ", ".join(sorted(targets)),
                start_to_close_timeout=timedelta(seconds=30 + 10 * len(targets)),
                # the drain heartbeats: a worker that died mid-drain is noticed in seconds
                # and the drain runs again (a drained Raylet is accepted again at once);
                # its start-to-close alone held the loop 17 minutes at 100 pods
                heartbeat_timeout=HEARTBEAT_TIMEOUT,
                retry_policy=RetryPolicy(maximum_attempts=3),
            )
        except ActivityError as exc:
            raise_if_cancelled(exc)
            why = f"the drain could not be asked: {_message(exc)}"
            return DrainResult(refused={n: why for n in targets})
        return result

    async def _start_resizes(self, inp: ReconcileInput, tick: Tick, p: Plan) -> int:
        in_flight = set(tick.resizing)
        # a grow in flight taken further goes to its saga: no new resize, outside the budget
        retargets = [r for r in p.resize if r.pod in in_flight and r.retarget]
        # the tick holds no more new resizes than may start (`decide.within_budget`)
        todo = [r for r in p.resize if r.pod not in in_flight]
        # a pod the read shows still but whose saga this loop runs: the read is older than
        # the saga's first write, or the saga ended and its end is still on its way here.
        # The decision goes to that saga as a new target, as a start would have done had
        # the saga been running; if it has ended, the signal fails and the next tick
        # decides on a fresh read. Started instead, a saga that had ended unheard was run
        # again from the size the read saw
        unheard = [r for r in todo if r.pod in self.sagas_running]
        # ... but not one that lowers the saga's target: the read shows none of that saga
        # (its patch not sent yet: queued behind a busy API server), so the plan did not
        # count the room it is bringing, and a lower target took a grow meant for two
        # tasks down to one (the 1,000-cluster burst left a task waiting so). The next
        # read shows the saga's patch, and the plan then takes it into account
        lower = [r for r in unheard if _below((r.cpu, r.memory), self.saga_targets.get(r.pod))]
        if lower:
            self._not_acted_on(
                inp,
                [r.pod for r in lower],
                "the read does not show the resize under way for each yet, and the plan "
                "would lower its target; decided again on a read that shows it",
                1.0,
            )
            unheard = [r for r in unheard if r not in lower]
        if tick.held_resizes:
            self._decided(
                f"held {tick.held_resizes} resize(s): {inp.max_concurrent_resizes} already running"
            )
        # a grow in flight taken further is for its saga alone: if that saga ended since the
        # observe, the next tick plans on what it left (a new saga would act on a stale
        # decision)
        results = await asyncio.gather(
            *(self._start_one(inp, r, tick, start=False) for r in [*retargets, *unheard]),
            *(self._start_one(inp, r, tick) for r in await self._fresh(inp, todo, tick.refs)),
        )
        return sum(results)

    async def _fresh(
        self, inp: ReconcileInput, resizes: list[ResizeAction], tick_refs: Mapping[str, PodRef]
    ) -> list[ResizeAction]:
        """The resizes decided on a read of their pod that began after its last saga (of
        this run) ended, leaving out pods whose saga this run has not heard end. One that
        ended while the read was under way (the pods read before its patch, Ray after its
        Raylet sync, under load) left the decision stale: a new saga from the size the
        read saw grew a pod that had just grown (the 1,000-cluster burst ran two resizes
        twice so). The next tick, soon, decides on a fresh read."""
        # A saga's end that reached this workflow task with the read (a backlogged task
        # holds both) is noted once every task that is ready has run: the read resumed
        # this code first. A condition is looked at only when nothing else is ready.
        await workflow.wait_condition(lambda: True)
        # a pod whose saga is still running as far as this run has heard is that saga's
        # (`_start_resizes` sends it the new target; `_settle` leaves it to finish)
        resizes = [r for r in resizes if r.pod not in self.sagas_running]
        fresh = [r for r in resizes if self.saga_ends.get(r.pod, -1.0) < self.observe_began]
        stale = sorted(r.pod for r in resizes if r not in fresh)
        if stale:
            self._not_acted_on(
                inp,
                stale,
                "the resize of each ended while the read it was decided on was under way; "
                "decided again on a fresh read",
                0.1,
            )
        # a read that began after the saga's end was heard can still be older than its
        # write: the pods came from a cache the write had not reached (#43 item 3)
        missed = [r for r in fresh if self._missed_write(r, tick_refs)]
        if missed:
            self._not_acted_on(
                inp,
                [r.pod for r in missed],
                "the read shows each at the size its last resize moved it away from, so it "
                "is older than the resize's write; decided again on a fresh read",
                1.0,
            )
        return [r for r in fresh if r not in missed]

    def _not_acted_on(
        self, inp: ReconcileInput, pods: list[str], why: str, again_in_s: float
    ) -> None:
        """Resizes decided but left for a fresh read: said in the log and the decisions,
        and the next decision comes within `again_in_s`."""
        line = f"not acted on: {', '.join(sorted(pods))}: {why}"
        workflow.logger.info("%s/%s: %s", inp.namespace, inp.cluster, line)
        self._decided(line)
        self.next_decision_in = min(self.next_decision_in or inp.retry_s, again_in_s)

    def _missed_write(self, r: ResizeAction, refs: Mapping[str, PodRef]) -> bool:
        """The decision's `from` is the size this pod's last saga moved it away from, a
        moment ago: the read did not see that saga's write."""
        now = workflow.now().timestamp()
        moved = self.memory.moved.get(r.pod)
        if moved is not None:
            uid, cpu, memory, ended = moved
            ref = refs.get(r.pod)
            same_pod = ref is None or not uid or ref.uid == uid
            if (
                same_pod
                and now - ended < STALE_WRITE_S
                and (r.from_cpu, r.from_memory)
                == (
                    cpu,
                    memory,
                )
            ):
                return True
        # a grow an earlier run of this loop started (before a continue-as-new): its end
        # never reaches this run, so the same holds from its start
        growing = self.memory.growing.get(r.pod)
        return (
            growing is not None
            and r.pod not in self.started_here
            and now - growing[2] < STALE_WRITE_S
            and (r.from_cpu, r.from_memory) == (growing[0], growing[1])
        )

    def _adopt_memory(self, tick: Tick) -> None:
        """The memory the tick hands back; `moved` is this workflow's own (a saga's end
        noted while the read was under way is not in the tick's copy), and a grow the read
        saw land is a move too: its saga may be an earlier run's, whose end this run never
        hears, and the next read may come from a cache that lags (another worker's)."""
        moved = dict(self.memory.moved)
        for pod, (at, _, _) in tick.memory.landed.items():
            started = self.memory.growing.get(pod)
            if started is not None and pod not in self.memory.landed:
                ref = tick.refs.get(pod)
                moved[pod] = (ref.uid if ref else "", started[0], started[1], at)
        memory = tick.memory.model_copy(update={"moved": moved})
        self.carry = self.carry.model_copy(update={"memory": memory})

    def _forget_old_moves(self) -> None:
        now = workflow.now().timestamp()
        kept = {p: m for p, m in self.memory.moved.items() if now - m[3] < STALE_WRITE_S}
        if len(kept) != len(self.memory.moved):
            self._remember(moved=kept)

    async def _settle(self, inp: ReconcileInput, tick: Tick) -> None:
        """A saga for each resize nobody works on any more: back to the pod's actual size.
        Where a saga still runs (paused by an operator, say), it is left to finish."""
        for r in await self._fresh(inp, list(tick.stuck), tick.refs):
            started = await self._start_one(inp, r, tick, retarget=False)
            if r.pod in self.memory.drift_since:
                # the next look at this Raylet comes a whole RAYLET_DRIFT_S later: a sync
                # that could not take (its old node not yet dead in Ray, say) is not
                # retried in a loop
                self._remember(
                    drift_since={**self.memory.drift_since, r.pod: workflow.now().timestamp()}
                )
            if started:
                line = f"settle {r.pod}: {r.reason}"
                # a pod launched at size has its Raylet brought to it as a matter of course;
                # the other settles mend what went wrong
                launched = r.launched
                log = workflow.logger.info if launched else workflow.logger.warning
                log("%s/%s: %s", inp.namespace, inp.cluster, line)
                self._decided(line)
                self.carry = self.carry.model_copy(
                    update={"resizes_started": self.carry.resizes_started + 1}
                )
                reason = "SyncingLaunchedRaylet" if launched else "SettlingStuckResize"
                await self._event(inp, reason, line[:1000], warning=not launched)

    async def _start_one(
        self,
        inp: ReconcileInput,
        r: ResizeAction,
        tick: Tick,
        *,
        retarget: bool = True,
        start: bool = True,
    ) -> int:
        """Start the pod's resize saga, or (with `retarget`) send the new target to the
        one running; without `start`, only send it (a grow in flight taken further)."""
        ref = tick.refs.get(r.pod)
        group = tick.groups.get(r.group)
        req = ResizeRequest(
            namespace=inp.namespace,
            cluster=inp.cluster,
            pod=r.pod,
            group=r.group,
            node_id=ref.raylet_id if ref else "",
            from_cpu=r.from_cpu,
            from_memory=r.from_memory,
            cpu=r.cpu,
            memory=r.memory,
            timeout_s=group.resize_timeout_s if group else 60,
            reason=r.reason,
            # the pod the plan saw: one created again under its name is not resized by it
            pod_uid=ref.uid if ref else "",
            poll_interval_s=inp.resize_poll_interval_s,
            poll_window_s=inp.resize_poll_window_s,
            demand_seen_at=self.memory.demand_seen_at
            if r.cpu > r.from_cpu or r.memory > r.from_memory
            else None,
            kube_cluster=inp.kube_cluster,
        )
        wf_id = resize_workflow_id(inp.namespace, r.pod, inp.kube_cluster)
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
            saga = await workflow.start_child_workflow(
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
                    **({"node": r.node} if r.node else {}),
                },
            )
            if r.cpu > r.from_cpu or r.memory > r.from_memory:
                # watched until it lands, and held after (`deadlines.GrowWatch`)
                growing = (r.from_cpu, r.from_memory, workflow.now().timestamp())
                self._remember(growing={**self.memory.growing, r.pod: growing})
            self.sagas_running.add(r.pod)
            self.started_here.add(r.pod)
            self.saga_targets[r.pod] = (r.cpu, r.memory)
            noting = asyncio.ensure_future(self._note_end(r.pod, req.pod_uid, saga))
            self.noting.add(noting)
            noting.add_done_callback(self.noting.discard)
            return 1
        except WorkflowAlreadyStartedError:
            if retarget:
                await self._send_retarget(inp, r, req, wf_id)
            return 0

    async def _note_end(
        self,
        pod: str,
        uid: str,
        saga: workflow.ChildWorkflowHandle[PodResizeWorkflow, ResizeSagaState],
    ) -> None:
        """When the saga ended (its outcome is its own to tell: `_fresh`). One that ended
        short of the target this run sent it wakes the loop to decide again on a fresh
        read: a saga done but for its end leaves a new target to the next tick, and
        nothing else may change to bring that tick before the wait's end (a 100-cluster
        burst: 4 tasks waited a whole tick beside room to grow for them)."""
        state: ResizeSagaState | None = None
        with contextlib.suppress(Exception):
            state = await saga
        self.saga_ends[pod] = workflow.now().timestamp()
        self.sagas_running.discard(pod)
        self.saga_targets.pop(pod, None)
        if (
            state is not None
            and state.outcome == ResizeOutcome.SUCCEEDED
            and (state.cpu, state.memory) != (state.from_cpu, state.from_memory)
        ):
            moved = (uid, state.from_cpu, state.from_memory, self.saga_ends[pod])
            self._remember(moved={**self.memory.moved, pod: moved})
        sent = self.sent_targets.pop(pod, None)
        if sent is not None and (
            state is None
            or state.outcome != ResizeOutcome.SUCCEEDED
            or (state.cpu, state.memory) != sent
        ):
            ended = "failed" if state is None else f"ended {state.outcome}"
            if state is not None:
                ended += f" at {size_text(state.cpu, state.memory)}"
            workflow.logger.info(
                "%s/%s: the resize of %s %s, not at the %s this loop sent it: deciding "
                "again on a fresh read",
                self.inp.namespace if self.inp else "",
                self.inp.cluster if self.inp else "",
                pod,
                ended,
                size_text(*sent),
            )
            self.woken = True

    async def _send_retarget(
        self, inp: ReconcileInput, r: ResizeAction, req: ResizeRequest, wf_id: str
    ) -> None:
        try:
            await workflow.get_external_workflow_handle(wf_id).signal(
                PodResizeWorkflow.retarget, req
            )
            self.sent_targets[r.pod] = self.saga_targets[r.pod] = (r.cpu, r.memory)
        except FailureError as exc:
            # the saga ended between the start and the signal: this resize is a new one,
            # the next tick starts it on fresh state (a failed signal must never fail
            # the loop: the cluster would be unmanaged, an operator's pause lost)
            line = f"retarget of {r.pod} not sent: its resize ended meanwhile ({exc.message})"
            workflow.logger.info("%s/%s: %s", inp.namespace, inp.cluster, line)
            self.next_decision_in = min(self.next_decision_in or inp.retry_s, inp.retry_s)

    async def _scale(self, inp: ReconcileInput, tick: Tick, p: Plan) -> bool:
        drained = self.memory.drained
        replicas, to_delete = scale_request(tick, p, drained)
        uids = {n: ref.uid for n, ref in tick.refs.items()}
        uids.update({d.pod: d.uid for d in drained})
        try:
            await workflow.execute_activity(
                Act.SCALE,
                ScaleInput(
                    namespace=inp.namespace,
                    cluster=inp.cluster,
                    replicas=replicas,
                    workers_to_delete=to_delete,
                    generation=tick.generation,
                    pod_uids={n: uids.get(n, "") for names in to_delete.values() for n in names},
                    launch_sizes={
                        a.group: (a.cpu, a.memory) for a in p.launch if a.cpu or a.memory
                    },
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
            # a local activity, as the observe: no workflow task of its own
            await workflow.execute_local_activity(
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
                # a call may wait its timeout (10 s) behind a saturated API server's calls
                # in flight, then take as long again: timed out sooner, it was sent again
                # beside itself, adding to the load (3,161 times in a 1,000-cluster burst)
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=3),
                local_retry_threshold=LOCAL_RETRY_THRESHOLD,
            )
        except FailureError as exc:  # an event is a courtesy: never block on it
            raise_if_cancelled(exc)
            workflow.logger.warning("event %s not recorded: %s", reason, _message(exc))

    # --- wait -----------------------------------------------------------------------------
    def _show(self, tick: Tick, timeout: float) -> None:
        """The Temporal UI's current details: what the loop last did and waits for."""
        if tick.in_tree_autoscaling:
            state = "standing by: Ray's in-tree autoscaler owns this cluster"
        elif self.carry.ray_autoscaler_pod:
            state = (
                "standing by: Ray's autoscaler still runs in head pod "
                f"{self.carry.ray_autoscaler_pod}"
            )
        elif tick.config_errors:
            state = "no action until ray.io/ippr is fixed: " + "; ".join(
                str(e) for e in tick.config_errors
            )
        else:
            last = self.decisions[-1].summary if self.decisions else "no action yet"
            state = f"last decision: {last}"
        if self.carry.observe_only:
            state = f"OBSERVE-ONLY ({OBSERVE_ONLY_VAR}): nothing is changed · {state}"
        when = workflow.now() + timedelta(seconds=timeout)
        workflow.set_current_details(
            f"{'PAUSED · ' if self.paused else ''}{state}\n\nwaiting for a change of the pods, "
            f"the RayCluster or Ray's demands, at most until {when:%H:%M:%S} UTC "
            f"({self.carry.resizes_started} resizes started, tick {self.carry.ticks})"
        )

    async def _wait(self, inp: ReconcileInput, tick: Tick | None) -> None:
        """Until something changes, a decision falls due, or the tick (a safety net)
        passes. An idle cluster thus costs an observe and a wait every `tick_s`
        (minutes), not every few seconds."""
        if self.woken:
            return
        if tick is None:
            # the read failed: try again soon, not after the long tick, and later after
            # each failure in a row (`_observe` chose when)
            when = workflow.now() + timedelta(seconds=self.retry_in)
            workflow.set_current_details(
                f"{'PAUSED · ' if self.paused else ''}{self.last_error}\n\nnext observe at "
                f"{when:%H:%M:%S} UTC (tick {self.carry.ticks})"
            )
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(lambda: self.woken, timeout=self.retry_in)
            return
        if not tick.gcs_address:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(lambda: self.woken, timeout=inp.retry_s)
            return
        timeout = inp.tick_s
        if self.next_decision_in is not None:
            timeout = max(0.1, min(timeout, self.next_decision_in))
        self._show(tick, timeout)
        # Ray's demands matter only where raysize may act: a cluster with a config error,
        # or one Ray's own autoscaler owns, waits on Kubernetes alone (the fix of the
        # annotation, the hand-over) and costs its GCS nothing
        # (observe-only plans beside Ray's autoscaler: its demands count)
        acting = not tick.config_errors and (tick.observe_only or not tick.ray_autoscaler_acts)
        watch = workflow.start_activity(
            Act.WAIT_FOR_CHANGE,
            WaitInput(
                namespace=inp.namespace,
                cluster=inp.cluster,
                gcs_address=tick.gcs_address,
                gcs_version=tick.gcs_version,
                pods_version=tick.pods_version,
                timeout_s=timeout,
                cluster_mark=tick.cluster_mark,
                watch_ray=acting,
                gcs_timetable=self.gcs_timetable,
            ),
            summary=f"wait for a change, at most {timeout:.3g}s"
            + ("" if acting else " (Kubernetes only: raysize may not act)"),
            start_to_close_timeout=timedelta(seconds=timeout + 30),
            heartbeat_timeout=WAIT_HEARTBEAT_TIMEOUT,
            retry_policy=RetryPolicy(maximum_attempts=1),
            # a signal that ends the wait (pause, resume, wake) abandons the watch instead
            # of asking the server to cancel it: a watch that completed at that very moment
            # made the cancel request fail the workflow task (ACTIVITY_UNKNOWN), and the
            # loop stalled until the task timed out. The watch ends by itself within the tick
            cancellation_type=ActivityCancellationType.ABANDON,
        )
        await until_done_or(watch, lambda: self.woken)
        if watch.done() and watch.exception() is not None:
            # the watch failed (GCS restarting, the worker stopped): don't spin, and wait
            # longer after each failure in a row
            self.watch_failures += 1
            pause = backoff_s(
                inp.retry_s, self.watch_failures, inp.retry_max_s, workflow.random().random()
            )
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(lambda: self.woken, timeout=pause)
        elif watch.done():
            self.watch_failures = 0
            learned = _timetable(watch.result(), tick.gcs_address)
            if learned is not None:
                self.gcs_timetable = learned


def _timetable(result: object, address: str) -> GcsTimetable | None:
    """The GCS timetable a wait returned (`WaitResult`), if it is of `address`. Read
    leniently: a worker of an earlier release returns a bare bool."""
    if not isinstance(result, dict):
        return None
    try:
        learned = WaitResult.model_validate(result).gcs_timetable
    except ValidationError:
        return None
    return learned if learned is not None and learned.address == address else None


def _scale_summary(replicas: dict[str, int], to_delete: dict[str, tuple[str, ...]]) -> str:
    text = "set replicas " + ", ".join(f"{g}={n}" for g, n in sorted(replicas.items()))
    removed = sum(len(names) for names in to_delete.values())
    return f"{text}; remove {removed} pod(s)" if removed else text


def _size(cpu: int, memory: int) -> str:
    mem = Resources({MEMORY: memory}).to_k8s().get("memory", "0")
    return f"{units_to_float(cpu, CPU):g} CPU, {mem}"


def _cause(exc: FailureError) -> BaseException | None:
    """What an activity failed with: an `ActivityError`'s cause, or (a local activity's
    failure, as the SDK raises it) the error itself."""
    return exc.cause if isinstance(exc, ActivityError) else exc


def _retry_after(exc: FailureError) -> float:
    """Seconds the failure asked to wait before the next try (a throttled API server's
    Retry-After, as the activity's `next_retry_delay`); 0 when it did not."""
    cause = _cause(exc)
    if isinstance(cause, ApplicationError) and cause.next_retry_delay is not None:
        return cause.next_retry_delay.total_seconds()
    return 0.0


def _message(exc: FailureError) -> str:
    cause = _cause(exc)
    if isinstance(cause, ApplicationError):
        return cause.message
    return str(cause or exc)
