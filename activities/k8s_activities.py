"""Kubernetes activities: resize pods and watch the kubelet, write a pod's
`ray.io/ippr-status`, scale groups, record events. `K8sActivities` exposes `Kube` to
Temporal under the activity names of `workflows.contracts.Act`, run on the API server's
threads (`activities/targets.py`) so the worker's event loop never blocks on HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from temporalio import activity

from raysize.activities.heartbeats import heartbeats
from raysize.activities.k8s import Kube
from raysize.activities.k8s_errors import (
    KubeError,
    NoRoom,
    Superseded,
)
from raysize.activities.k8s_objects import (
    Obj,
    is_same_pod,
    progress_of,
)
from raysize.activities.observe_only import ObserveOnly
from raysize.activities.pod_watch import PodWatch, Subscription
from raysize.activities.targets import Targets, calls_of
from raysize.workflows.contracts import (
    HEARTBEAT_TIMEOUT,
    Act,
    ApplyResizeInput,
    ApplyResizeResult,
    EventInput,
    FinishResizeInput,
    FinishResizeResult,
    ProgressState,
    ResizeProgress,
    ScaleInput,
    SetStatusInput,
    WaitResizeInput,
)

T = TypeVar("T")

log = logging.getLogger(__name__)

HEARTBEAT_EVERY_S = HEARTBEAT_TIMEOUT.total_seconds() / 3  # well inside the saga's timeout
# an apply's `finish` (a GCS call, then a pod write) is begun only with this much of the
# activity's start-to-close timeout left: begun later, a slow GCS would time the whole
# apply out, and its retry would patch and watch again. Left out, the saga runs it
FINISH_NEEDS_S = 20.0

Finisher = Callable[[FinishResizeInput], Awaitable[FinishResizeResult]]


class K8sActivities:
    """The Temporal face of `Kube`: typed errors become non-retryable where they must."""

    def __init__(
        self,
        kube: Kube,
        pods: PodWatch | None = None,
        observe_only: ObserveOnly | None = None,
        targets: Targets | None = None,
        finisher: Finisher | None = None,
        launch_at_size: bool = True,
    ) -> None:
        """`pods`: the worker's shared pod watch; without it, waits poll the pod.
        `observe_only`: the worker's switch; on, every write here is refused (Events
        excepted). `targets`: the worker's threads for blocking calls (its own if None).
        `finisher`: `finish_resize`'s work (the Raylet, then the final status), which an
        apply with `finish` does once the kubelet is done; without it, the saga does."""
        self.kube = kube
        self.pods = pods
        self.observe_only = observe_only or ObserveOnly()
        self.targets = targets or Targets()
        self.finisher = finisher
        # RAYSIZE_LAUNCH_AT_SIZE: write the size new pods start at (Kube.write_launch_sizes)
        self.launch_at_size = launch_at_size

    def _call(self, fn: Callable[..., T], *args: Any, write: bool = False) -> Awaitable[T]:
        """`fn(*args)` on the threads of the API server (activities/targets.py); `write`:
        a saga's or a reconcile's write, sent before the reads waiting there."""
        return self.targets.on_kube(self.kube, fn, *args, write=write)

    async def _run(self, fn: Callable[..., T], *args: Any, write: bool = False) -> T:
        try:
            return await self._call(fn, *args, write=write)
        except KubeError as exc:
            raise exc.to_application_error() from None

    def activities(self) -> list[Callable[..., Any]]:
        return [
            self.apply_resize,
            self.wait_resize,
            self.set_status,
            self.scale_groups,
            self.record_event,
        ]

    @activity.defn(name=Act.APPLY_RESIZE)
    async def apply_resize(self, inp: ApplyResizeInput) -> ApplyResizeResult:
        """PATCH pods/resize (absolute, so a retry repeats nothing), record
        ray.io/ippr-status, then watch the kubelet for up to the window; with `finish`,
        once the kubelet is done, bring the Raylet to the pod's size and write the final
        status (`finished`). It heartbeats throughout: a patch queued behind a saturated
        API server is not timed out and sent again beside itself."""
        calls_of(inp.namespace, inp.cluster)
        await self.observe_only.refuse(f"resize of pod {inp.namespace}/{inp.pod}")
        began = time.monotonic()
        with heartbeats(HEARTBEAT_EVERY_S):
            applied = await self._apply_resize(inp)
            if (
                inp.finish is None
                or self.finisher is None
                or applied.progress.state != ProgressState.DONE
                or not _time_left_to_finish(began)
            ):
                return applied
            return applied.model_copy(update={"finished": await self._finish(inp.finish)})

    async def _finish(self, finish: FinishResizeInput) -> FinishResizeResult | None:
        """The Raylet to the pod's size, then the final status; None if that did not take
        (the saga's `finish_resize` does it then, with its retries and its answers to a
        Raylet or pod gone). Begun, it is carried through even when the activity is
        canceled meanwhile (a new target, an operator's cancel): the pod has its size, so
        the resize is done, and the saga is told, with the Raylet's size, in the result.
        A result the saga could not take (canceled by an operator) leaves it unsure of
        the Raylet, which its rollback then brings back first."""
        assert self.finisher is not None
        job = asyncio.ensure_future(self.finisher(finish))
        await _carried_through(job)
        try:
            return job.result()
        except Exception as exc:
            log.info(
                "%s/%s: the kubelet is done; the Raylet and the final status are left to "
                "finish_resize: %s",
                finish.namespace,
                finish.pod,
                exc,
            )
            return None

    async def _apply_resize(self, inp: ApplyResizeInput) -> ApplyResizeResult:
        sent = asyncio.ensure_future(
            self._call(
                self.kube.patch_resize,
                inp.namespace,
                inp.pod,
                inp.cpu,
                inp.memory,
                inp.pod_uid,
                inp.expect,
                write=True,
            )
        )
        try:
            try:
                generation = await asyncio.shield(sent)
            except asyncio.CancelledError:
                # the request is on its way: let it land (or fail) before this activity
                # ends, so the saga's next patch (a rollback) always comes after it
                while not sent.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.shield(sent)
                raise
        except NoRoom as exc:  # 1.36+ admission: what 1.33-1.35's kubelet says as Infeasible
            return await self._refused_for_room(inp, exc)
        except Superseded as exc:  # not where the decision saw it: nothing was written
            log.warning("%s: %s", inp.pod, exc.message)
            return _superseded(exc)
        except KubeError as exc:
            raise exc.to_application_error() from None
        with contextlib.ExitStack() as stack:
            # listening before the status write: a kubelet that finishes after the write
            # and before the watch would begin is heard (it was only at the next read of
            # the pod, after POLL_INTERVAL_S of silence: 5 s)
            changes = (
                None
                if self.pods is None
                else stack.enter_context(self.pods.subscribe(inp.namespace, inp.pod))
            )
            now = await self._run(
                self.kube.set_ippr_status,
                inp.namespace,
                inp.pod,
                inp.status,
                inp.pod_uid,
                write=True,
            )
            progress = await self._watch(
                inp.namespace, inp.pod, inp.pod_uid, inp.cpu, inp.memory, generation,
                inp.poll_interval_s, inp.window_s, now, changes,
            )  # fmt: skip
        return ApplyResizeResult(generation=generation, progress=progress)

    async def _refused_for_room(self, inp: ApplyResizeInput, exc: NoRoom) -> ApplyResizeResult:
        """The pod was left as it was: report Infeasible with the server's numbers, so the
        saga asks again at what fits or rolls back, as for the kubelet's Infeasible."""
        pod = await self._run(self.kube.find_pod, inp.namespace, inp.pod, inp.pod_uid)
        if pod is None:
            return ApplyResizeResult(
                generation=0, progress=ResizeProgress(state=ProgressState.POD_GONE)
            )
        generation = int(pod["metadata"].get("generation", 0))
        progress = progress_of(pod, inp.cpu, inp.memory, generation).model_copy(
            update={
                "state": ProgressState.INFEASIBLE,
                "reason": "Infeasible",
                "message": f"refused at admission: {exc.message}",
            }
        )
        return ApplyResizeResult(generation=generation, progress=progress)

    @activity.defn(name=Act.WAIT_RESIZE)
    async def wait_resize(self, inp: WaitResizeInput) -> ResizeProgress:
        """Poll the pod until the resize leaves IN_PROGRESS or the window ends; heartbeats
        throughout (a slow read of the pod too)."""
        calls_of(inp.namespace, inp.cluster)
        with heartbeats(HEARTBEAT_EVERY_S):
            return await self._watch(
                inp.namespace, inp.pod, inp.pod_uid, inp.cpu, inp.memory, inp.generation,
                inp.poll_interval_s, inp.window_s,
            )  # fmt: skip

    async def _watch(
        self,
        namespace: str,
        pod: str,
        uid: str,
        cpu: int,
        memory: int,
        generation: int,
        poll_interval_s: float,
        window_s: float,
        current: Obj | None = None,
        subscribed: Subscription | None = None,
    ) -> ResizeProgress:
        """Where the resize stands; a pod of the name with another `uid` is the pod gone.
        `current`: the pod as just read; `subscribed`: the caller's subscription to the pod's
        changes, made before that read."""
        # the callers heartbeat from a task of their own (`heartbeats`)
        deadline = time.monotonic() + window_s
        if self.pods is None:
            while True:
                progress = await self._run(
                    self.kube.resize_progress, namespace, pod, cpu, memory, generation, uid
                )
                left = deadline - time.monotonic()
                if progress.state != ProgressState.IN_PROGRESS or left <= 0:
                    return progress
                await asyncio.sleep(min(poll_interval_s, left))
        # subscribe first, then read: no change can fall between the two
        with contextlib.ExitStack() as stack:
            changes = (
                subscribed
                if subscribed is not None
                else stack.enter_context(self.pods.subscribe(namespace, pod))
            )
            # what the caller just read is as new as a read now (the watch has the rest)
            obj = current or await self._run(self.kube.find_pod, namespace, pod, uid)
            while True:
                if obj is None or not is_same_pod(obj, uid):
                    return ResizeProgress(state=ProgressState.POD_GONE)
                progress = progress_of(obj, cpu, memory, generation)
                left = deadline - time.monotonic()
                if progress.state != ProgressState.IN_PROGRESS or left <= 0:
                    return progress
                # silence longer than the poll interval: read the pod (a watch can be
                # quiet for reasons of its own), every few seconds at most
                heard = await changes.wait(min(poll_interval_s, HEARTBEAT_EVERY_S, left))
                if heard and changes.latest is not None and not changes.deleted:
                    obj = changes.latest
                else:  # silence, a restarted watch, or a deletion to confirm: read it
                    obj = await self._run(self.kube.find_pod, namespace, pod, uid)

    @activity.defn(name=Act.SET_STATUS)
    async def set_status(self, inp: SetStatusInput) -> None:
        calls_of(inp.namespace, inp.cluster)
        await self.observe_only.refuse(f"ray.io/ippr-status of pod {inp.namespace}/{inp.pod}")
        await self._run(
            self.kube.set_ippr_status, inp.namespace, inp.pod, inp.status, inp.pod_uid, write=True
        )

    @activity.defn(name=Act.SCALE)
    async def scale_groups(self, inp: ScaleInput) -> bool:
        calls_of(inp.namespace, inp.cluster)
        await self.observe_only.refuse(f"scaling RayCluster {inp.namespace}/{inp.cluster}")
        return await self._run(
            self.kube.scale,
            inp.namespace,
            inp.cluster,
            inp.replicas,
            inp.workers_to_delete,
            inp.generation,
            inp.pod_uids,
            dict(inp.launch_sizes) if self.launch_at_size else None,
            write=True,
        )

    @activity.defn(name=Act.EVENT)
    async def record_event(self, inp: EventInput) -> None:
        calls_of(inp.namespace, inp.name if inp.kind == "RayCluster" else "")
        await self._run(
            self.kube.record_event,
            inp.namespace,
            inp.kind,
            inp.name,
            inp.reason,
            inp.message,
            inp.warning,
        )


def _superseded(exc: Superseded) -> ApplyResizeResult:
    """The apply's answer when its compare-and-set found the pod elsewhere: the pod as
    found (its size), and why; the saga ends `Superseded` without a rollback."""
    pod = exc.pod
    generation = int((pod.get("metadata") or {}).get("generation", 0))
    found = (
        progress_of(pod, 0, 0, generation)
        if pod.get("spec")
        else ResizeProgress(state=ProgressState.SUPERSEDED)
    )
    progress = found.model_copy(
        update={"state": ProgressState.SUPERSEDED, "reason": "Superseded", "message": exc.message}
    )
    return ApplyResizeResult(generation=generation, progress=progress)


def _time_left_to_finish(began: float) -> bool:
    """Whether this activity has FINISH_NEEDS_S of its start-to-close timeout left."""
    timeout = activity.info().start_to_close_timeout
    if timeout is None:
        return True
    return timeout.total_seconds() - (time.monotonic() - began) >= FINISH_NEEDS_S


async def _carried_through(job: asyncio.Future[Any]) -> None:
    """Wait until `job` has ended, whatever cancels the caller meanwhile (`job` is not
    canceled with it). Its outcome is the caller's to read."""
    while not job.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([job])
