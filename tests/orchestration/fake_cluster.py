"""A scripted pod + Raylet behind activities with the real activity names, for saga tests.

It plays the kubelet's part by rules a test sets: finish at once, defer with the kubelet's
message, fail with an actuation error, never finish, or lose the pod.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from temporalio import activity
from temporalio.exceptions import ApplicationError

from raysize.workflows.contracts import (
    Act,
    ApplyResizeInput,
    ApplyResizeResult,
    Err,
    FinishResizeInput,
    FinishResizeResult,
    ProgressState,
    RayletResizeInput,
    RayletResizeResult,
    ResizeProgress,
    SetStatusInput,
    WaitResizeInput,
)
from raysize.workflows.ippr_status import IpprStatus


@dataclass
class FakePod:
    cpu: int
    memory: int
    raylet_cpu: int
    raylet_memory: int
    raylet_in_use_cpu: int = 0
    generation: int = 1
    spec_cpu: int = 0
    spec_memory: int = 0
    status: IpprStatus = field(default_factory=IpprStatus)
    node_room_cpu: int = 1 << 40  # how big the node lets this pod's cpu request be
    gone: bool = False
    uid: str = ""  # another value: the pod was deleted and created again under its name


class FakeCluster:
    def __init__(self, pod: FakePod) -> None:
        self.pod = pod
        pod.spec_cpu, pod.spec_memory = pod.cpu, pod.memory
        self.mode = "done"  # done | hang | error
        self.error_message = 'cannot decrease memory limits: attempting to set container "ray" memory limit (1) below current usage (2)'
        self.raylet_failures = 0
        self.refuse_patches = False  # answer every resize patch with 422 Invalid
        # seconds a resize patch is on its way inside the activity before it lands; it
        # lands even if the activity is canceled meanwhile (a request already sent)
        self.patch_in_flight_s = 0.0
        self.hold_rollback = False  # the kubelet takes its time putting a pod back
        self.raylet_gone = False  # the pod is there, its Raylet is not (its Ray died)
        # the kubelet watch fails this many times with an error no retry helps (a bug, or
        # an API server that refuses for good): the activity gives up
        self.watch_failures = 0
        self.calls: list[str] = []
        self.patches: list[tuple[int, int]] = []
        self.raylet_calls: list[tuple[int, int]] = []
        self.statuses: list[IpprStatus] = []
        self.uids: list[tuple[str, str]] = []  # (activity, the pod UID it was given)
        self.polls_started = asyncio.Event()
        # the kubelet finishes just after a watch that saw it still at work has ended: the
        # saga learns of it only if it looks again
        self.finish_unseen = False
        # an apply asked to `finish` does finish_resize's work too once the kubelet is
        # done, as the worker's own does (`K8sActivities.finisher`); off: as a worker
        # whose apply has no finisher, the saga's own finish_resize does it
        self.finish_in_apply = True
        # set: a Raylet resize waits for it (`raylet_called` says one is waiting)
        self.raylet_gate: asyncio.Event | None = None
        self.raylet_called = asyncio.Event()
        # an apply that did finish_resize's work then fails for good (its worker lost and
        # its retries spent): the saga never hears where the Raylet went
        self.fail_after_finish = False

    def activities(self) -> list[object]:
        async def patch(inp: ApplyResizeInput) -> int:
            self.uids.append(("patch", inp.pod_uid))
            self._alive(inp.pod_uid)
            self.calls.append("patch")
            if self.refuse_patches:
                raise ApplicationError(
                    'Pod "w1" is invalid: spec: Forbidden: Pod running on node without '
                    "support for resize",
                    type=Err.INVALID,
                    non_retryable=True,
                )
            if self.patch_in_flight_s and (inp.cpu, inp.memory) != (self.pod.cpu, self.pod.memory):
                # a grow's request is on its way (a rollback's is quick): it lands even if
                # the activity is canceled meanwhile; like the real activity, this one
                # waits for it before it ends
                async def land() -> None:
                    await asyncio.sleep(self.patch_in_flight_s)
                    self.patches.append((inp.cpu, inp.memory))

                sent = asyncio.ensure_future(land())
                activity.heartbeat()
                try:
                    await asyncio.shield(sent)
                except asyncio.CancelledError:
                    while not sent.done():
                        with contextlib.suppress(asyncio.CancelledError):
                            await asyncio.shield(sent)
                    raise
            else:
                self.patches.append((inp.cpu, inp.memory))
            self.pod.spec_cpu, self.pod.spec_memory = inp.cpu, inp.memory
            self.pod.generation += 1
            self.pod.status = inp.status
            self.statuses.append(inp.status)
            return self.pod.generation

        @activity.defn(name=Act.APPLY_RESIZE)
        async def apply(inp: ApplyResizeInput) -> ApplyResizeResult:
            running = (self.pod.cpu, self.pod.memory)
            expect = getattr(inp, "expect", None)  # (None from a release before it)
            if expect is not None and running not in {*expect, (inp.cpu, inp.memory)}:
                # the compare-and-set, as the real activity's: nothing written
                self.calls.append("superseded")
                return ApplyResizeResult(
                    generation=self.pod.generation,
                    progress=ResizeProgress(
                        state="superseded",
                        reason="Superseded",
                        message=f"pod w1 runs at {running}, not at {expect}: not patched",
                        cpu=self.pod.cpu,
                        memory=self.pod.memory,
                    ),
                )
            generation = await patch(inp)
            progress = await watch(
                WaitResizeInput(
                    namespace=inp.namespace,
                    pod=inp.pod,
                    cpu=inp.cpu,
                    memory=inp.memory,
                    generation=generation,
                    poll_interval_s=inp.poll_interval_s,
                    window_s=inp.window_s,
                    pod_uid=inp.pod_uid,
                )
            )
            applied = ApplyResizeResult(generation=generation, progress=progress)
            if inp.finish is None or not self.finish_in_apply or progress.state != "done":
                return applied
            # carried through a cancel, as the real one (`K8sActivities._finish`)
            job = asyncio.ensure_future(finish(inp.finish))
            while not job.done():  # a cancel of this activity does not reach `job`
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([job])
            try:
                done = job.result()
            except ApplicationError:
                return applied  # the saga's finish_resize does it, with its retries
            if self.fail_after_finish:
                self.fail_after_finish = False
                raise ApplicationError(
                    "activity lost after its Raylet step", type="Lost", non_retryable=True
                )
            return applied.model_copy(update={"finished": done})

        @activity.defn(name=Act.WAIT_RESIZE)
        async def wait(inp: WaitResizeInput) -> ResizeProgress:
            self.uids.append(("wait", inp.pod_uid))
            if self.watch_failures:
                self.watch_failures -= 1
                raise ApplicationError(
                    "the server has asked for the client to provide credentials",
                    type="KubernetesUnavailable",
                    non_retryable=True,
                )
            return await watch(inp)

        async def watch(inp: WaitResizeInput) -> ResizeProgress:
            self.calls.append("wait")
            self.polls_started.set()
            until = asyncio.get_running_loop().time() + inp.window_s
            while True:  # one look at least, as the real activity (a window of 0: one read)
                if self._replaced(inp.pod_uid):
                    return ResizeProgress(state=ProgressState.POD_GONE)
                back_to_old = (inp.cpu, inp.memory) == (self.pod.cpu, self.pod.memory)
                if inp.cpu > self.pod.node_room_cpu and not back_to_old:
                    return ResizeProgress(
                        state=ProgressState.DEFERRED,
                        reason="Deferred",
                        message=(
                            "Node didn't have enough resource: cpu, requested: "
                            f"{inp.cpu}, used: 1000, capacity: {self.pod.node_room_cpu + 1000}"
                        ),
                        cpu=self.pod.cpu,
                        memory=self.pod.memory,
                    )
                if back_to_old and self.hold_rollback:
                    if asyncio.get_running_loop().time() >= until:
                        break
                    activity.heartbeat()
                    await asyncio.sleep(0.02)
                    continue
                if self.mode == "done" or back_to_old:
                    self.pod.cpu, self.pod.memory = inp.cpu, inp.memory
                    return ResizeProgress(
                        state=ProgressState.DONE, cpu=self.pod.cpu, memory=self.pod.memory
                    )
                if self.mode == "error":
                    return ResizeProgress(
                        state=ProgressState.ERROR, reason="Error", message=self.error_message
                    )
                if asyncio.get_running_loop().time() >= until:
                    break
                activity.heartbeat()
                await asyncio.sleep(0.02)
            progress = ResizeProgress(state=ProgressState.IN_PROGRESS, cpu=self.pod.cpu)
            if self.finish_unseen:  # the kubelet is done a moment after this look
                self.pod.cpu, self.pod.memory = self.pod.spec_cpu, self.pod.spec_memory
            return progress

        @activity.defn(name=Act.FINISH_RESIZE)
        async def finish(inp: FinishResizeInput) -> FinishResizeResult:
            self.uids.append(("finish", inp.pod_uid))
            applied = await raylet(inp)
            await set_status(
                SetStatusInput(
                    namespace=inp.namespace, pod=inp.pod, status=inp.status, pod_uid=inp.pod_uid
                )
            )
            return FinishResizeResult(cpu=applied.cpu, memory=applied.memory)

        @activity.defn(name=Act.SET_STATUS)
        async def set_status(inp: SetStatusInput) -> None:
            self.uids.append(("status", inp.pod_uid))
            self._alive(inp.pod_uid)
            self.calls.append("status")
            self.pod.status = inp.status
            self.statuses.append(inp.status)

        @activity.defn(name=Act.RESIZE_RAYLET)
        async def raylet(inp: RayletResizeInput) -> RayletResizeResult:
            self.calls.append("raylet")
            self.uids.append(("raylet", inp.pod_uid))
            if self._replaced(inp.pod_uid):
                raise ApplicationError('pods "w1" not found', type=Err.POD_GONE, non_retryable=True)
            if self.raylet_gone:
                raise ApplicationError("node is dead", type=Err.RAYLET_GONE, non_retryable=True)
            if self.raylet_failures > 0:
                self.raylet_failures -= 1
                raise ApplicationError("GCS unavailable", type="RayUnavailable")
            self.raylet_called.set()
            if self.raylet_gate is not None:
                await self.raylet_gate.wait()
            self.raylet_calls.append((inp.cpu, inp.memory))
            # like the Raylet: a downsize is clamped to what is in use
            self.pod.raylet_cpu = max(inp.cpu, self.pod.raylet_in_use_cpu)
            self.pod.raylet_memory = inp.memory
            return RayletResizeResult(cpu=self.pod.raylet_cpu, memory=self.pod.raylet_memory)

        return [apply, wait, set_status, raylet, finish]

    def _replaced(self, uid: str) -> bool:
        """As the real activities see a pod: gone, or another pod under its name."""
        return self.pod.gone or bool(uid and self.pod.uid and uid != self.pod.uid)

    def _alive(self, uid: str = "") -> None:
        if self._replaced(uid):
            raise ApplicationError('pods "w1" not found', type=Err.POD_GONE, non_retryable=True)
