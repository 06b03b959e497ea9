"""PodResizeWorkflow (`resize/<namespace>/<pod>`): the saga of one in-place pod resize.

(a) shrink the Raylet first for every dimension that shrinks; its reply is the truth
(b) PATCH pods/<pod>/resize (absolute, QoS kept) and record ray.io/ippr-status
(c) poll the pod until the kubelet is done, bounded by the group's resize-timeout
(d) Deferred/Infeasible with a kubelet report → ask again at the size it allows
(e) Error, timeout or operator cancel → roll the pod (and Raylet) back, record why
(f) done → resize the Raylet through the GCS until it takes, clear resizing-at

The patch is a compare-and-set (`ApplyResizeInput.expect`): a pod that does not run at
the size the resize was decided from (or where this saga's own patches put it) is not
patched, and the saga ends `Superseded` without a rollback: the decision was made on a
stale read (or the pod changed since), and the next tick decides again on a fresh one.

On the happy path (b), (c) and a first try of (f) are one activity (`apply_pod_resize`
with `finish`): two workflow tasks for the saga instead of three. If that try does not
take, the saga runs (f) as its own activity, with its retries.

Every pod write names the pod's UID the resize was decided on (`ResizeRequest.pod_uid`): a
pod created again under the same name is the saga's pod gone, never resized by it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NoReturn, TypeVar

from temporalio import workflow
from temporalio.common import (
    RetryPolicy,
    SearchAttributeUpdate,
)
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from raysize.workflows import telemetry
    from raysize.workflows.contracts import (
        HEARTBEAT_TIMEOUT,
        PENDING_CAUSES,
        Act,
        ApplyResizeInput,
        ApplyResizeResult,
        AttemptRecord,
        Err,
        FailureCause,
        FinishResizeInput,
        FinishResizeResult,
        ProgressState,
        RayletResizeInput,
        RayletResizeResult,
        ResizeOutcome,
        ResizePhase,
        ResizeProgress,
        ResizeRequest,
        ResizeSagaState,
        SetStatusInput,
        WaitResizeInput,
    )
    from raysize.workflows.ippr_status import IpprStatus
    from raysize.workflows.kubelet_messages import KubeletReport, parse_kubelet_message
    from raysize.workflows.naming import (
        RESIZE_OUTCOME,
        RESIZE_PHASE,
        RESIZE_WORKFLOW,
        resize_search_attributes,
    )
    from raysize.workflows.resources import size_text
    from raysize.workflows.summaries import outcome_details
    from raysize.workflows.waiting import until_done_or

T = TypeVar("T")


K8S_TIMEOUT = timedelta(seconds=30)
K8S_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=20,
    non_retryable_error_types=[Err.POD_GONE, Err.INVALID, Err.FORBIDDEN],
)
WATCH_RETRY = RetryPolicy(
    maximum_interval=timedelta(seconds=5),
    non_retryable_error_types=[Err.POD_GONE, Err.FORBIDDEN],
)
RAYLET_SYNC_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=0,  # until it takes: a Raylet that disagrees with its pod is a bug
    non_retryable_error_types=[Err.RAYLET_GONE, Err.POD_GONE, Err.RAY_INVALID, Err.RAY_AUTH],
)


def next_target_from_report(
    report: KubeletReport, progress: ResizeProgress, cpu: int, memory: int
) -> tuple[int, int]:
    """The kubelet speaks of total requests; our sizes are limits: add the gap back, take
    the pod's other containers off (as Ray does)."""
    if report.resource == "cpu":
        allowed = report.max_request + progress.cpu_gap - progress.other_cpu_requests
        return min(cpu, allowed), memory
    allowed = report.max_request + progress.memory_gap - progress.other_memory_requests
    return cpu, min(memory, allowed)


class _Failed(Exception):
    """The resize can't go on; roll back with this reason (`cause`: its type)."""

    def __init__(self, message: str, cause: FailureCause) -> None:
        super().__init__(message)
        self.cause = cause


class _PodGone(Exception):
    pass


class _RayletGone(Exception):
    """The pod is there, its Raylet is not (its Ray process died, its node left Ray)."""


class _Superseded(Exception):
    """The pod is not where the resize was decided from: it was left alone."""


@workflow.defn(name=RESIZE_WORKFLOW)
class PodResizeWorkflow:
    def __init__(self) -> None:
        self.req: ResizeRequest | None = None
        self.phase = ResizePhase.STARTING
        self.outcome = ResizeOutcome.PENDING
        self.paused = False
        self.new_target: tuple[int, int] | None = None
        self.cpu = 0
        self.memory = 0
        self.attempts: list[AttemptRecord] = []
        self.raylet: tuple[int, int] | None = None
        self.detail = ""
        self.cause = FailureCause.UNKNOWN  # why it did not take, once it did not
        self.status = IpprStatus()
        self.unset_attributes: list[SearchAttributeUpdate[Any]] = []
        self.indexed_phase: str | None = None
        self.rolling_back = False
        # the size an apply with `finish` may have brought the Raylet to, while the saga
        # does not know whether it did (the apply's end not taken: a new target, an
        # operator's cancel, or its finish did not take): the Raylet is then shrunk
        # first below it, and a rollback brings the Raylet back too
        self.raylet_unsure: tuple[int, int] | None = None
        self.finished: FinishResizeResult | None = None  # the apply did finish_resize's work
        # the sizes this saga's applies asked for (a patch of each may have landed): with
        # the starting size, where the pod may be for the next patch to go ahead
        self.asked: list[tuple[int, int]] = []

    # --- messages ------------------------------------------------------------------------
    @workflow.signal
    def pause(self) -> None:
        self.paused = True
        self._show()

    @workflow.signal
    def resume(self) -> None:
        self.paused = False
        self._show()

    @workflow.signal
    def retarget(self, target: ResizeRequest) -> None:
        """The planner wants another size for this pod: go there instead. The size it is
        already going to is no news, and a saga rolling back or done takes none."""
        wanted = (target.cpu, target.memory)
        if self.rolling_back or self.phase == ResizePhase.DONE:
            return
        if wanted == (self.cpu, self.memory) and self.new_target is None:
            return
        self.new_target = wanted

    @workflow.query
    def state(self) -> ResizeSagaState:
        req = self.req
        return ResizeSagaState(
            pod=req.pod if req else "",
            phase=self.phase,
            outcome=self.outcome,
            from_cpu=req.from_cpu if req else 0,
            from_memory=req.from_memory if req else 0,
            cpu=self.cpu,
            memory=self.memory,
            paused=self.paused,
            attempts=tuple(self.attempts),
            raylet_cpu=self.raylet[0] if self.raylet else None,
            raylet_memory=self.raylet[1] if self.raylet else None,
            detail=self.detail,
        )

    # --- the saga ------------------------------------------------------------------------
    @workflow.run
    async def run(self, req: ResizeRequest) -> ResizeSagaState:
        self.req = req
        self.cpu, self.memory = req.cpu, req.memory
        self.status = IpprStatus(raylet_id=req.node_id)
        # who this resize is about and its outcome (pending), unless the starter set them
        # (the reconcile workflow does): sent with the first phase, in one upsert
        given = workflow.info().typed_search_attributes
        self.unset_attributes = [
            pair.key.value_set(pair.value)
            for pair in resize_search_attributes(req).search_attributes
            if pair.key != RESIZE_PHASE and given.get(pair.key) != pair.value
        ]
        self.indexed_phase = given.get(RESIZE_PHASE)  # a starter may set the first phase
        telemetry.resize_started(req)
        try:
            await self._resize(req)
        except _PodGone:
            self._finish(ResizeOutcome.POD_GONE, "the pod is gone")
        except _RayletGone:
            self._finish(
                ResizeOutcome.RAYLET_GONE,
                f"the pod has {self.cpu}m CPU / {self.memory} bytes, but its Raylet is gone "
                "(its Ray process died or its node left the Ray cluster): nothing to sync",
            )
        except _Superseded as superseded:
            self.cause = FailureCause.SUPERSEDED
            if len(self.asked) > 1:
                # an earlier apply of this saga wrote `resizing-at`: it is over
                with contextlib.suppress(_PodGone, _Failed, ActivityError):
                    await self._set_status(
                        req, self.status.model_copy(update={"resizing_at": None})
                    )
            self._finish(
                ResizeOutcome.SUPERSEDED,
                f"{superseded}; left as it is, the next tick decides on a fresh read",
            )
        except _Failed as failure:
            back = await self._roll_back(req, str(failure), failure.cause)
            # _roll_back said why; a rollback not read back is no rollback
            self._finish(ResizeOutcome.ROLLED_BACK if back else ResizeOutcome.FAILED, "")
        except (asyncio.CancelledError, ActivityError) as exc:
            # a CancelledError is always a cancel: what is not is an ActivityError
            if isinstance(exc, ActivityError) and not is_cancelled_exception(exc):
                # an activity that gave up (its retries spent) must not end the saga
                # with the pod half-way: a patch may have landed. Put it back, as for
                # any failure, and end with an outcome instead of a failed workflow.
                back = await self._roll_back(
                    req,
                    f"activity failed: {_error_message(exc) or exc}",
                    FailureCause.ACTIVITY_ERROR,
                )
                self._finish(ResizeOutcome.ROLLED_BACK if back else ResizeOutcome.FAILED, "")
                return self.state()
            workflow.logger.info("resize of %s canceled by operator: rolling back", req.pod)
            back = await self._roll_back(req, "canceled by operator", FailureCause.CANCELED)
            self._finish(ResizeOutcome.CANCELED if back else ResizeOutcome.FAILED, "")
            raise
        return self.state()

    async def _resize(self, req: ResizeRequest) -> None:
        while True:
            await self._gate()
            # only a real kubelet or API answer is an attempt, not a new target
            tries = [a for a in self.attempts if a.result != "retargeted"]
            if len(tries) >= req.max_attempts:
                raise _Failed(f"gave up after {len(tries)} attempts", FailureCause.MAX_ATTEMPTS)
            target = (self.cpu, self.memory)
            # (a) Raylet first where the pod shrinks, so Ray never over-schedules: below
            # the pod's starting size, or below what an apply whose end the saga did not
            # take may have brought the Raylet to. It goes to no more than the starting
            # size: a Raylet that apply did not reach is never grown ahead of its pod
            high_cpu, high_memory = self._raylet_high(req)
            if self.cpu < high_cpu or self.memory < high_memory:
                self._set_phase(ResizePhase.SHRINKING_RAYLET)
                applied = await self._raylet(
                    req, min(self.cpu, req.from_cpu), min(self.memory, req.from_memory)
                )
                self.raylet_unsure = None  # the reply is the Raylet's size (or it is gone)
                if applied is not None:
                    if self.cpu < high_cpu:
                        self.cpu = max(self.cpu, applied.cpu)
                    if self.memory < high_memory:
                        self.memory = max(self.memory, applied.memory)
                await self._gate()
            # (b) ask Kubernetes, (c) watch the kubelet, and (f) once it is done, the
            # Raylet and the final status: one activity on the happy path
            self._set_phase(ResizePhase.POLLING)
            self.status = self.status.model_copy(
                update={"resizing_at": int(workflow.now().timestamp())}
            )
            progress = await self._apply(
                req,
                self.cpu,
                self.memory,
                self.status,
                finish=self.status.model_copy(update={"resizing_at": None}),
                expect=((req.from_cpu, req.from_memory), *self.asked),
            )
            if progress is None:
                if self.new_target is not None:
                    self.attempts.append(self._attempt("retargeted"))
                    self.cpu, self.memory = self.new_target
                    self.new_target = None
                    continue
                self.attempts.append(self._attempt("timed out"))
                raise _Failed(f"Pod resize timed out after {req.timeout_s}s", FailureCause.TIMEOUT)
            if progress.state == ProgressState.DONE:
                self.attempts.append(self._attempt("done"))
                break
            if progress.state == ProgressState.POD_GONE:
                raise _PodGone()
            if progress.state == ProgressState.SUPERSEDED:
                self.attempts.append(self._attempt("superseded"))
                raise _Superseded(progress.message or "the pod is not where it was decided from")
            if progress.state == ProgressState.ERROR:
                self.attempts.append(self._attempt("error"))
                raise _Failed(progress.message or "Pod resize failed", FailureCause.KUBELET_ERROR)
            # (d) Deferred / Infeasible: the kubelet says how much room there is
            self.attempts.append(self._attempt(f"{progress.reason}: {progress.message}"))
            report = parse_kubelet_message(progress.reason, progress.message)
            pending = PENDING_CAUSES.get(progress.reason or "", FailureCause.KUBELET_ERROR)
            if report is None:
                raise _Failed(f"resize {progress.reason}: {progress.message}", pending)
            cpu, memory = next_target_from_report(report, progress, self.cpu, self.memory)
            cpu, memory = (
                max(cpu, min(req.from_cpu, target[0])),
                max(memory, min(req.from_memory, target[1])),
            )
            self.status = self.status.model_copy(
                update={
                    "suggested_max_cpu": cpu if report.resource == "cpu" else None,
                    "suggested_max_memory": memory if report.resource == "memory" else None,
                }
            )
            if (cpu, memory) == target or (cpu <= req.from_cpu and memory <= req.from_memory):
                raise _Failed(
                    f"resize {progress.reason}: no room on the node ({progress.message})", pending
                )
            self.detail = f"{progress.reason}: asking again at the size the node allows"
            self.cpu, self.memory = cpu, memory

        # (f) the pod has it: now the Raylet, then the final ray.io/ippr-status, unless
        # the apply did both
        finished = self.finished
        if finished is None:
            await self._gate()
            self._set_phase(ResizePhase.SYNCING_RAYLET)
            done = self.status.model_copy(update={"resizing_at": None})
            finished = await self._finish_resize(req, self.cpu, self.memory, done, saying_why=True)
            if finished is None:
                raise _PodGone()
        telemetry.raylet_synced(req)
        note = finished.status_error
        self._finish(ResizeOutcome.SUCCEEDED, note and f"ray.io/ippr-status not written: {note}")

    async def _apply(
        self,
        req: ResizeRequest,
        cpu: int,
        memory: int,
        status: IpprStatus,
        *,
        finish: IpprStatus | None = None,
        expect: tuple[tuple[int, int], ...] | None = None,
    ) -> ResizeProgress | None:
        """Patch the pod and wait for the kubelet, bounded by the group's resize-timeout;
        None on timeout or when a new target arrives (none does while rolling back). With
        `finish` (the final status), the activity also brings the Raylet to the pod's size
        once the kubelet is done (`self.finished`). With `expect`, the patch is a
        compare-and-set: the pod must run at one of those sizes (or the target), else the
        progress is `SUPERSEDED` and nothing was written."""
        deadline = workflow.now() + timedelta(seconds=req.timeout_s)
        window = min(req.poll_window_s, req.timeout_s)
        then = None
        unsure_before = self.raylet_unsure
        if expect is not None:
            self.asked.append((cpu, memory))
        if finish is not None:
            then = _finish_input(req, cpu, memory, finish)
            self.raylet_unsure = _larger(unsure_before, (cpu, memory))
        apply = workflow.start_activity(
            Act.APPLY_RESIZE,
            ApplyResizeInput(
                namespace=req.namespace,
                pod=req.pod,
                cpu=cpu,
                memory=memory,
                status=status,
                poll_interval_s=req.poll_interval_s,
                window_s=window,
                pod_uid=req.pod_uid,
                finish=then,
                expect=expect,
                cluster=req.cluster,
            ),
            result_type=ApplyResizeResult,
            summary=f"patch pods/resize to {size_text(cpu, memory)}, then watch the kubelet"
            + (" and bring the Raylet to it" if then else ""),
            start_to_close_timeout=timedelta(seconds=window) + K8S_TIMEOUT,
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=K8S_RETRY,
            # a canceled patch must have landed (or not) before anything else is sent: a
            # rollback's patch can never be overtaken by the grow it undoes
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )
        try:
            applied: ApplyResizeResult | None = await self._unless_retargeted(
                apply, keep=lambda a: isinstance(a, ApplyResizeResult) and a.finished is not None
            )
        except ActivityError as exc:
            self._raise_k8s_failure(exc)
        if applied is None:
            return None
        self.status = status
        if applied.finished is not None and then is not None:
            # done, Raylet included: a new target that came meanwhile is for the next
            # tick, on a fresh read (as one that comes while the saga syncs the Raylet)
            self.finished = applied.finished
            self.raylet = (applied.finished.cpu, applied.finished.memory)
            self.raylet_unsure = None
            self.status = then.status
            return applied.progress
        if then is not None and applied.progress.state != ProgressState.DONE:
            # this apply left the Raylet alone (it does not touch it before the kubelet is
            # done); an apply without `finish` (a rollback's) says nothing of the Raylet
            self.raylet_unsure = unsure_before
        if applied.progress.state != ProgressState.IN_PROGRESS:
            return applied.progress
        self._show(_kubelet_says(applied.progress, workflow.now()))
        return await self._poll(req, applied.generation, deadline)

    async def _poll(
        self, req: ResizeRequest, generation: int, deadline: datetime
    ) -> ResizeProgress | None:
        """Keep waiting for the kubelet; None on timeout or when a new target arrives.

        The workflow sleeps on a durable timer, backing off, then one activity watches the
        pod for a window (heartbeating), until the resize timeout: the timeout lives in the
        workflow, so it survives worker restarts and time-skipping tests.
        """
        pause = 1.0
        while True:
            remaining = (deadline - workflow.now()).total_seconds()
            if remaining <= 0:
                return await self._past_deadline(req, generation)
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self.new_target is not None, timeout=min(pause, remaining)
                )
            if self.new_target is not None:
                return None
            pause = min(pause * 2, 30.0)
            remaining = (deadline - workflow.now()).total_seconds()
            if remaining <= 0:
                return await self._past_deadline(req, generation)
            progress = await self._look(req, generation, min(req.poll_window_s, remaining))
            if progress is None:
                return None
            if progress.state != ProgressState.IN_PROGRESS:
                return progress
            self._show(_kubelet_says(progress, workflow.now()))

    async def _past_deadline(self, req: ResizeRequest, generation: int) -> ResizeProgress | None:
        """The resize timeout is over: None (timed out), unless one more look at the pod
        finds the kubelet done or the pod gone. The saga may wake up long after its last
        look (it slept on a timer, or its worker or the API server was down over the
        deadline) and the kubelet may have finished meanwhile: rolling back a resize that
        took would undo it and record it as failed, so the planner would never grow the
        pod again."""
        progress = await self._look(req, generation, 0.0)  # a window of 0: one read
        if progress is not None and progress.state in (ProgressState.DONE, ProgressState.POD_GONE):
            return progress
        return None

    async def _look(
        self, req: ResizeRequest, generation: int, window: float
    ) -> ResizeProgress | None:
        """Watch the pod for up to `window` seconds (activity `wait_pod_resize`); None when
        a new target arrives first."""
        poll = workflow.start_activity(
            Act.WAIT_RESIZE,
            WaitResizeInput(
                namespace=req.namespace,
                pod=req.pod,
                cpu=self.cpu,
                memory=self.memory,
                generation=generation,
                poll_interval_s=req.poll_interval_s,
                window_s=window,
                pod_uid=req.pod_uid,
                cluster=req.cluster,
            ),
            result_type=ResizeProgress,
            summary=f"watch the kubelet resize to {size_text(self.cpu, self.memory)}",
            start_to_close_timeout=timedelta(seconds=window) + K8S_TIMEOUT,
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=WATCH_RETRY,
        )
        try:
            return await self._unless_retargeted(poll)
        except ActivityError as exc:
            if _error_type(exc) == Err.POD_GONE:
                raise _PodGone() from exc
            raise

    async def _roll_back(self, req: ResizeRequest, reason: str, cause: FailureCause) -> bool:
        """Put the pod and its Raylet back where they started, and say why. True only when
        the pod's spec, its actual size (the kubelet's report) and its Raylet are read back
        at the starting size; False says the rollback is not confirmed (and why, in
        `detail`)."""
        self._set_phase(ResizePhase.ROLLING_BACK)
        # no new target from here on: the way back is the target
        self.rolling_back = True
        self.new_target = None
        self.detail, self.cause = reason, cause
        now = int(workflow.now().timestamp())
        failed = self.status.model_copy(
            update={"last_failed_at": now, "last_failed_reason": reason, "resizing_at": now}
        )
        try:
            raylet_high = self._raylet_high(req)
            if raylet_high[0] > req.from_cpu or raylet_high[1] > req.from_memory:
                # the Raylet may hold more than the pod goes back to (an apply brought it
                # up before the failure or the cancel reached it): it goes first, as in any
                # shrink, so Ray never keeps room the pod loses. What it keeps runs work
                kept = await self._raylet(req, req.from_cpu, req.from_memory)
                self.raylet_unsure = None
                if kept is not None and (kept.cpu > req.from_cpu or kept.memory > req.from_memory):
                    raise _Failed(
                        f"Ray runs work on the new room (its Raylet keeps "
                        f"{size_text(kept.cpu, kept.memory)}): the pod keeps its size, as a "
                        "rollback would take the room from under that work",
                        cause,
                    )
            self.cpu, self.memory = req.from_cpu, req.from_memory
            progress = await self._apply(req, req.from_cpu, req.from_memory, failed)
            cpu, memory = req.from_cpu, req.from_memory
            if progress is not None and progress.state == ProgressState.DONE:
                cpu, memory = progress.cpu or cpu, progress.memory or memory
            else:
                seen = (
                    f"{progress.reason or progress.state.value}: {progress.message}"
                    if progress is not None
                    else f"no answer within {req.timeout_s}s"
                )
                raise _Failed(f"the kubelet did not confirm the starting size ({seen})", cause)
            done = failed.model_copy(update={"resizing_at": None})
            if self.raylet_unsure is not None or (
                self.raylet is not None and self.raylet != (cpu, memory)
            ):
                await self._finish_resize(req, cpu, memory, done)
            else:
                await self._set_status(req, done)
            if self.raylet is not None and self.raylet != (cpu, memory):
                raise _Failed(f"the Raylet reports {self.raylet}, not {(cpu, memory)}", cause)
            return True
        except _PodGone:
            self.detail = f"{reason}; the pod is gone"
            return True  # nothing left to put back
        except (_Failed, ActivityError) as failure:  # the way back failed too: say so, end
            if isinstance(failure, ActivityError):
                if is_cancelled_exception(failure):
                    raise
                failure = _Failed(f"activity failed: {_error_message(failure) or failure}", cause)
            self.detail = f"{reason}; rolling back failed: {failure}"
            workflow.logger.warning("resize of %s: %s", req.pod, self.detail)
            try:
                with contextlib.suppress(_Failed, _PodGone):
                    # still record the failure, so the planner never picks this pod again
                    await self._set_status(req, failed.model_copy(update={"resizing_at": None}))
            except ActivityError as exc:
                if is_cancelled_exception(exc):
                    raise
            return False

    # --- steps ---------------------------------------------------------------------------
    async def _gate(self) -> None:
        """A paused saga holds here, before its next side effect."""
        if self.paused:
            workflow.logger.info("resize of %s paused", self.req.pod if self.req else "?")
            await workflow.wait_condition(lambda: not self.paused)

    async def _k8s(
        self, name: str, arg: object, result_type: type[T] | None = None, summary: str = ""
    ) -> T:
        try:
            result: T = await workflow.execute_activity(
                name,
                arg,
                result_type=result_type,
                summary=summary or None,
                start_to_close_timeout=K8S_TIMEOUT,
                retry_policy=K8S_RETRY,
            )
            return result
        except ActivityError as exc:
            self._raise_k8s_failure(exc)

    async def _unless_retargeted(
        self, activity: asyncio.Future[T], keep: Callable[[T], bool] | None = None
    ) -> T | None:
        """The activity's result, or None (the activity canceled) when a new target
        arrives first; with `keep`, a result the activity ended with all the same is
        taken if `keep` says so (a resize it finished despite the cancel)."""
        try:
            await until_done_or(activity, lambda: self.new_target is not None)
        except asyncio.CancelledError:
            # the operator canceled: let the activity end before the rollback
            activity.cancel()
            with contextlib.suppress(ActivityError, asyncio.CancelledError):
                await activity
            raise
        if not activity.done() or self.new_target is not None:
            # canceled (or done as the target changed): wait for it to end, so whatever it
            # sent has landed before the next patch, and take its end as read
            with contextlib.suppress(ActivityError, asyncio.CancelledError):
                result = await activity
                if keep is not None and keep(result):
                    return result
            return None
        return activity.result()

    @staticmethod
    def _raise_k8s_failure(exc: ActivityError) -> NoReturn:
        """What a failed Kubernetes activity means for the saga."""
        kind = _error_type(exc)
        if kind == Err.POD_GONE:
            raise _PodGone() from exc
        if kind in (Err.INVALID, Err.FORBIDDEN):
            raise _Failed(
                f"Kubernetes refused the resize: {_error_message(exc)}", FailureCause.REFUSED
            ) from exc
        raise exc

    async def _set_status(self, req: ResizeRequest, status: IpprStatus) -> None:
        self.status = status
        await self._k8s(
            Act.SET_STATUS,
            SetStatusInput(
                namespace=req.namespace,
                pod=req.pod,
                status=status,
                pod_uid=req.pod_uid,
                cluster=req.cluster,
            ),
            type(None),
            "write the pod's ray.io/ippr-status",
        )

    async def _raylet(
        self, req: ResizeRequest, cpu: int, memory: int, *, until_it_takes: bool = False
    ) -> RayletResizeResult | None:
        """Resize the Raylet; None when its node is gone (nothing left to keep in step)."""
        try:
            result: RayletResizeResult = await workflow.execute_activity(
                Act.RESIZE_RAYLET,
                _raylet_input(req, cpu, memory),
                result_type=RayletResizeResult,
                summary=f"resize the Raylet to {size_text(cpu, memory)}",
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RAYLET_SYNC_RETRY
                if until_it_takes
                else RetryPolicy(
                    maximum_attempts=5,
                    non_retryable_error_types=RAYLET_SYNC_RETRY.non_retryable_error_types,
                ),
            )
        except ActivityError as exc:
            if _error_type(exc) in (Err.RAYLET_GONE, Err.POD_GONE):
                return None
            raise
        self.raylet = (result.cpu, result.memory)
        return result

    async def _finish_resize(
        self,
        req: ResizeRequest,
        cpu: int,
        memory: int,
        status: IpprStatus,
        *,
        saying_why: bool = False,
    ) -> FinishResizeResult | None:
        """The Raylet to the pod's size, until it takes, then the final status; None when
        the pod or its node is gone (with `saying_why`, a Raylet gone while its pod is
        there raises `_RayletGone`)."""
        try:
            result: FinishResizeResult = await workflow.execute_activity(
                Act.FINISH_RESIZE,
                _finish_input(req, cpu, memory, status),
                result_type=FinishResizeResult,
                summary=f"Raylet to {size_text(cpu, memory)}, then ray.io/ippr-status",
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RAYLET_SYNC_RETRY,
            )
        except ActivityError as exc:
            kind = _error_type(exc)
            if kind == Err.RAYLET_GONE and saying_why:
                raise _RayletGone() from exc
            if kind in (Err.RAYLET_GONE, Err.POD_GONE):
                return None
            raise
        self.raylet = (result.cpu, result.memory)
        self.raylet_unsure = None
        self.status = status
        return result

    # --- bookkeeping ---------------------------------------------------------------------
    def _raylet_high(self, req: ResizeRequest) -> tuple[int, int]:
        """The most the Raylet may hold now: its starting size, what it last replied, or
        what an apply whose end the saga did not take may have brought it to
        (`raylet_unsure`)."""
        return _larger(self.raylet_unsure, _larger(self.raylet, (req.from_cpu, req.from_memory)))

    def _attempt(self, result: str) -> AttemptRecord:
        return AttemptRecord(cpu=self.cpu, memory=self.memory, result=result)

    def _show(self, now: str = "") -> None:
        """What the saga is doing, as the Temporal UI's current details say it."""
        req = self.req
        if req is None:
            return
        target = size_text(self.cpu, self.memory)
        start = size_text(req.from_cpu, req.from_memory)
        text = {
            ResizePhase.SHRINKING_RAYLET: f"shrinking the Raylet to {target} before the pod",
            ResizePhase.POLLING: f"asked the kubelet for {target}; waiting for it to act",
            ResizePhase.SYNCING_RAYLET: f"the pod has {target}: bringing its Raylet to it",
            ResizePhase.ROLLING_BACK: f"rolling back to {start}",
        }.get(self.phase, self.phase.value)
        if now:
            text = f"{text} · kubelet: {now}"
        if self.detail and self.phase != ResizePhase.DONE:
            text = f"{text} · {self.detail}"
        if self.paused:
            text = f"PAUSED by an operator before its next step · {text}"
        workflow.set_current_details(text)

    def _set_phase(self, phase: ResizePhase) -> None:
        """Keep `ResizePhase` current; upsert only what the index does not have yet."""
        if phase != self.phase:
            self.phase = phase
            self._show()
            updates, self.unset_attributes = self.unset_attributes, []
            if self.indexed_phase != phase.value:
                updates.append(RESIZE_PHASE.value_set(phase.value))
                self.indexed_phase = phase.value
            if updates:
                workflow.upsert_search_attributes(updates)

    def _finish(self, outcome: ResizeOutcome, detail: str) -> None:
        self.outcome = outcome
        if detail:
            self.detail = detail
        self.phase = ResizePhase.DONE
        updates = [u for u in self.unset_attributes if u.key != RESIZE_OUTCOME]
        self.unset_attributes = []
        workflow.upsert_search_attributes(
            [
                *updates,
                RESIZE_PHASE.value_set(self.phase.value),
                RESIZE_OUTCOME.value_set(outcome.value),
            ]
        )
        if self.req is not None:
            telemetry.resize_finished(
                self.req, outcome, self.cause, self.detail, self.cpu, self.memory
            )
        workflow.set_current_details(
            outcome_details(outcome.value, self.cpu, self.memory, self.detail)
        )


def _finish_input(
    req: ResizeRequest, cpu: int, memory: int, status: IpprStatus
) -> FinishResizeInput:
    """The Raylet of the saga's pod to `cpu`/`memory`, then `status` on the pod."""
    return FinishResizeInput(**dict(_raylet_input(req, cpu, memory)), status=status)


def _raylet_input(req: ResizeRequest, cpu: int, memory: int) -> RayletResizeInput:
    """The Raylet of the saga's pod to `cpu`/`memory`."""
    return RayletResizeInput(
        namespace=req.namespace,
        cluster=req.cluster,
        pod=req.pod,
        node_id=req.node_id,
        cpu=cpu,
        memory=memory,
        pod_uid=req.pod_uid,
    )


def _larger(a: tuple[int, int] | None, b: tuple[int, int]) -> tuple[int, int]:
    """Each dimension's larger of the two (`a` None: `b`)."""
    return b if a is None else (max(a[0], b[0]), max(a[1], b[1]))


def _kubelet_says(progress: ResizeProgress, now: datetime) -> str:
    what = progress.reason or "resize in progress"
    text = f"{what} ({progress.message})" if progress.message else what
    return f"{text}, seen {now:%H:%M:%S} UTC"


def _error_type(exc: ActivityError) -> str | None:
    cause = exc.cause
    return cause.type if isinstance(cause, ApplicationError) else None


def _error_message(exc: ActivityError) -> str:
    cause = exc.cause
    return cause.message if isinstance(cause, ApplicationError) else str(exc)
