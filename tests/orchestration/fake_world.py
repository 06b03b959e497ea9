"""A scripted Ray cluster on Kubernetes behind the reconcile workflow's activities."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from temporalio import activity
from temporalio.exceptions import ApplicationError

from raysize.activities.cluster import plan_tick
from raysize.activities.targets import Targets
from raysize.workflows.contracts import (
    Act,
    DrainInput,
    DrainResult,
    EventInput,
    GcsTimetable,
    Memory,
    Observation,
    ObserveInput,
    ScaleInput,
    Tick,
    WaitInput,
    WaitResult,
)
from raysize.workflows.model import ClusterSnapshot, Demand, PodPhase, PodView
from raysize.workflows.pod_template import ConfigError
from raysize.workflows.resources import Resources


class FakeWorld:
    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.snapshot = snapshot
        self.found = True
        self.config_errors: tuple[ConfigError, ...] = ()
        self.in_tree_autoscaling = False
        self.ray_autoscaler_pod = ""  # a head pod whose `autoscaler` container runs
        self.fail_observe = 0
        self.fail_wait = 0  # the next waits fail (the watch broke)
        # called as each observe attempt reads, before anything else: may raise (a failed
        # read) or change the world
        self.on_read: Callable[[], None] | None = None
        # awaited once a read is made and before it answers (the world may move on while
        # a slow observe is still under way)
        self.while_reading: Callable[[], Awaitable[None]] | None = None
        # every observe attempt: (its attempt number, when it started, in the server's time)
        self.observe_attempts: list[tuple[int, datetime]] = []
        # the server's clock (`WorkflowEnvironment.get_current_time`), set by `reconciling`
        self.clock: Callable[[], Awaitable[datetime]] | None = None
        self.replicas = {g: sum(1 for p in snapshot.pods if p.group == g) for g in snapshot.groups}
        self.resizing: set[str] = set()
        # Every pod whose resize began, in order: `resizing` is only the ones running now.
        self.started: list[str] = []
        self.scales: list[ScaleInput] = []
        self.events: list[EventInput] = []
        self.event_timeouts: list[timedelta | None] = []  # each Event's, as it was given
        self.observed = 0
        self.version = 0
        self.waits: list[WaitInput] = []  # every wait the loop asked for
        # the GCS timetable each wait returns, in turn (its worker's; None: nothing learned)
        self.timetables: list[GcsTimetable | None] = []
        self.bare_waits = False  # the waits answer as a worker of release 0.1 did: a bool
        # Ray is slow to report: a grown pod runs the work it grew for, which Ray still
        # reports as pending
        self.stale_demand = False
        # a quiet wait ends after this long at most (the loop observes again), not after
        # the whole tick as the real wait does; a test of what wakes the loop raises it
        self.quiet_wait_s = 0.3
        self.drains: list[DrainInput] = []  # every drain the loop asked for
        self.refuse_drain: dict[str, str] = {}  # pod → Ray's reason for refusing its drain
        # called inside the drain activity, before it answers (a pause, a worker kill)
        self.on_drain: Callable[[DrainInput], Awaitable[None]] | None = None
        self.fail_scale: list[ApplicationError] = []  # raised by the next scales, in order
        # the write is recorded, and its answer takes this long to reach the workflow (a
        # test that looks at the status the moment a write lands must wait for the tick)
        self.scale_answer_s = 0.0
        self._uids = itertools.count(1)
        self.uids: dict[str, str] = {}  # pod → its UID, given at its first observe
        self.memories: list[Memory] = []  # what the loop remembered, at each observe
        self.observe_only = False  # the worker's RAYSIZE_OBSERVE_ONLY, as the observe reports it
        self.targets = Targets()  # the planner's threads, as the worker's (idle ones end)

    def set_demands(self, *demands: tuple[Resources, int]) -> None:
        self.snapshot = self.snapshot.model_copy(
            update={"demands": tuple(Demand(shape=s, count=n) for s, n in demands)}
        )
        self.version += 1

    def resized(self, name: str, cpu: int, memory: int) -> None:
        """The Raylet took its new size: it holds more, and the demand it ran is gone
        (`stale_demand`: the room is taken, and the demand is still reported)."""
        pods = []
        for p in self.snapshot.pods:
            if p.name == name:
                grow = Resources.of(cpu=cpu - p.total.cpu, memory=memory - p.total.memory)
                # the kubelet has the size the spec asks: no resize in flight any more
                p = p.model_copy(
                    update={
                        "total": p.total + grow,
                        "available": p.available if self.stale_demand else p.available + grow,
                        "resize": None,
                    }
                )
            pods.append(p)
        demands = self.snapshot.demands if self.stale_demand else ()
        self.snapshot = self.snapshot.model_copy(update={"pods": tuple(pods), "demands": demands})
        self.version += 1

    def activities(self) -> list[object]:
        @activity.defn(name=Act.OBSERVE)
        async def observe(inp: ObserveInput) -> Tick:
            # the product's own decision on the scripted read (`workflows/decide.py`), as
            # the real observe makes it (its plan-duration metric included)
            self.memories.append(inp.memory)
            return await plan_tick(
                await read(inp), inp, self.targets, observe_only=self.observe_only
            )

        async def read(inp: ObserveInput) -> Observation:
            self.observed += 1
            info = activity.info()
            # the observe is a local activity: its times are the worker's clock, not the
            # test server's, which skips (a retry's backoff is a workflow timer)
            began = (
                await self.clock()
                if self.clock is not None
                else datetime.fromtimestamp(inp.now, UTC)
                + (info.started_time - info.scheduled_time)
            )
            self.observe_attempts.append((info.attempt, began))
            if self.on_read is not None:
                self.on_read()
            if self.fail_observe:
                self.fail_observe -= 1
                raise ApplicationError("list pods: timed out", type="K8sUnavailable")
            # every pod that exists has a UID (a pod not created yet has none)
            pods = tuple(p.model_copy(update={"uid": self.uid(p.name)}) for p in self.snapshot.pods)
            read = Observation(
                found=self.found,
                snapshot=self.snapshot.model_copy(update={"pods": pods}),
                config_errors=self.config_errors,
                in_tree_autoscaling=self.in_tree_autoscaling,
                ray_autoscaler_pod=self.ray_autoscaler_pod,
                replicas=dict(self.replicas),
                resource_version=str(self.version),
                gcs_address="127.0.0.1:6379",
                gcs_version=self.version,
                pods_version=str(self.version),
                resizing=tuple(sorted(self.resizing)),
            )
            if self.while_reading is not None:
                await self.while_reading()
            return read

        @activity.defn(name=Act.WAIT_FOR_CHANGE)
        async def wait(inp: WaitInput) -> WaitResult | bool:
            self.waits.append(inp)
            if self.fail_wait:
                self.fail_wait -= 1
                raise ApplicationError("the pod watch broke", type="KubernetesUnavailable")
            learned = self.timetables.pop(0) if self.timetables else None
            loop = asyncio.get_running_loop()
            until = loop.time() + min(inp.timeout_s, self.quiet_wait_s)
            while loop.time() < until:
                if self.version != inp.gcs_version:
                    return (
                        True if self.bare_waits else WaitResult(changed=True, gcs_timetable=learned)
                    )
                activity.heartbeat()
                await asyncio.sleep(0.01)
            return False if self.bare_waits else WaitResult(changed=False, gcs_timetable=learned)

        @activity.defn(name=Act.DRAIN)
        async def drain(inp: DrainInput) -> DrainResult:
            self.drains.append(inp)
            if self.on_drain is not None:
                await self.on_drain(inp)
            refused = {
                t.pod: self.refuse_drain[t.pod] for t in inp.targets if t.pod in self.refuse_drain
            }
            return DrainResult(
                accepted=tuple(t.pod for t in inp.targets if t.pod not in refused),
                refused=refused,
            )

        @activity.defn(name=Act.SCALE)
        async def scale(inp: ScaleInput) -> None:
            if self.fail_scale:
                raise self.fail_scale.pop(0)
            self.scales.append(inp)
            pods = list(self.snapshot.pods)
            for group, n in inp.replicas.items():
                have = [p for p in pods if p.group == group]
                for i in range(n - len(have)):
                    g = self.snapshot.groups[group]
                    pods.append(
                        PodView(
                            name=f"{group}-new-{len(self.scales)}-{i}",
                            group=group,
                            phase=PodPhase.PENDING,
                            total=g.resources,
                            available=g.resources,
                        )
                    )
            gone = {n for names in inp.workers_to_delete.values() for n in names}
            self.snapshot = self.snapshot.model_copy(
                update={"pods": tuple(p for p in pods if p.name not in gone)}
            )
            self.replicas = dict(inp.replicas)
            self.version += 1
            await asyncio.sleep(self.scale_answer_s)

        @activity.defn(name=Act.EVENT)
        async def event(inp: EventInput) -> None:
            self.events.append(inp)
            self.event_timeouts.append(activity.info().start_to_close_timeout)

        return [observe, wait, drain, scale, event]

    def uid(self, pod: str) -> str:
        if pod not in self.uids:
            self.uids[pod] = f"uid-{next(self._uids)}"
        return self.uids[pod]
