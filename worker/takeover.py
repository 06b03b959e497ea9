"""A rolling update of the worker Deployment, with Worker Versioning: the new build takes
over a version whose workers are gone (issue #43, item 1).

Kubernetes rolls a Deployment by starting pods of the new template and stopping the old
ones (`helm upgrade --set image.tag=…`, `kubectl apply`). With every workflow PINNED, what
was running stays on the old build, and the old build has no worker left: loops and
resizes in flight would wait forever, and new workflows too while the old build is the
deployment's current version. So a versioned worker looks, every
`RAYSIZE_UPGRADE_CHECK_S`, at which builds still poll its task queue:

1. the deployment's current version has had no worker polling for
   `RAYSIZE_TAKEOVER_AFTER_S` (a live worker polls at least once a long poll, 60 s on
   Temporal's default) → this worker makes its own version current (not when the
   deployment has a manager, such as the Temporal Worker Controller, nor with
   `RAYSIZE_MAKE_CURRENT=never`);
2. this worker's version is current → every running workflow of the task queue pinned to
   another build that has no worker polling either is replayed here first, from its
   history, on this build's code (`Replayer`, the worker's own runner and converter); one
   that replays is moved to this build (a PINNED versioning override), and a loop is woken
   so it runs at once; one that does not is left where it is, said once as an ERROR with
   what to do;
3. a moved run's override is removed once a workflow task of it has completed here: the
   run is then pinned to this build by its own record, and a later upgrade moves it as
   usual (a PINNED override would follow the loop through every continue-as-new).

A build that still has workers (a new build run beside the old one, README *Upgrading
raysize*) is never taken over: its workflows finish there, as before."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from google.protobuf.field_mask_pb2 import FieldMask
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.deployment.v1 import WorkerDeploymentVersion as VersionProto
from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflow.v1 import VersioningOverride, WorkflowExecutionOptions
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    GetWorkflowExecutionHistoryReverseRequest,
    UpdateWorkflowExecutionOptionsRequest,
)
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Replayer

from raysize.worker.deployment import describe_routing, make_current
from raysize.worker.settings import Settings
from raysize.workflows.naming import DISCOVERY_WORKFLOW, RECONCILE_WORKFLOW

log = logging.getLogger("raysize.worker")

# histories replayed at once while taking over (each is a fetch and a replay on this
# worker's event loop)
REPLAY_CONCURRENCY = 8
LOOPS = (RECONCILE_WORKFLOW, DISCOVERY_WORKFLOW)
_OVERRIDE_MASK = FieldMask(paths=["versioning_override"])
# what a moved run's history says (`Takeover._state_here`), besides a next run's ID
DONE_HERE, WAITING, ENDED = "done-here", "waiting", "ended"
_CLOSED = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
}


async def last_polls(client: Client, task_queue: str, deployment_name: str) -> dict[str, float]:
    """Seconds since each build of the deployment last polled the task queue (workflow or
    activity tasks, whichever is more recent), as the server remembers its pollers; a
    build it does not list has not polled for minutes."""
    ages: dict[str, float] = {}
    now = time.time()
    for kind in (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY):
        resp = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=kind,
            )
        )
        for poller in resp.pollers:
            options = poller.deployment_options
            if options.deployment_name != deployment_name or not options.build_id:
                continue
            age = max(0.0, now - poller.last_access_time.ToMicroseconds() / 1e6)
            ages[options.build_id] = min(age, ages.get(options.build_id, age))
    return ages


@dataclass(frozen=True)
class Run:
    workflow_id: str
    run_id: str
    workflow_type: str
    build_id: str  # the build it is pinned to


@dataclass
class Takeover:
    """What one worker has moved and refused, across its checks (and reconnects: the
    client is given to each call)."""

    settings: Settings
    version: WorkerDeploymentVersion
    replayer: Replayer
    moved: dict[tuple[str, str], Run] = field(default_factory=dict)
    refused: set[tuple[str, str]] = field(default_factory=set)

    @property
    def label(self) -> str:
        return self.version.to_canonical_string()

    async def step(self, client: Client, current: str, manager: str) -> str | None:
        """One look (see the module's doc); returns the build ID of the current version
        after it ("" when there is none). `current` and `manager` are the deployment's,
        as just described."""
        await self._unpin_moved(client)
        if current != self.version.build_id:
            if not current or not await self._gone(client, current):
                return current
            if manager and manager != client.identity:
                log.warning(
                    "the current version %s.%s has had no worker polling %s for %.0fs, but "
                    "the deployment is managed by %r: left to it",
                    self.version.deployment_name,
                    current,
                    self.settings.task_queue,
                    self.settings.takeover_after_s,
                    manager,
                )
                return current
            if self.settings.make_current == "never":
                return current
            if not await self._promote(client, current):
                return current
        await self._move_abandoned(client)
        return self.version.build_id

    async def _gone(self, client: Client, build: str) -> bool:
        ages = await last_polls(client, self.settings.task_queue, self.version.deployment_name)
        age = ages.get(build)
        return age is None or age > self.settings.takeover_after_s

    async def _promote(self, client: Client, gone: str) -> bool:
        routing = await describe_routing(client, self.version)
        if routing is None or routing.current != gone:
            return False  # changed meanwhile: look again next time
        if not await make_current(client, self.version, routing):
            return False  # another worker promoted itself, or the server is busy
        log.warning(
            "made %s current in place of %s, which has had no worker polling %s for "
            "over %.0fs (a rolling update replaced it; RAYSIZE_TAKEOVER_AFTER_S): new "
            "workflows start here, and the workflows pinned to %s move here once their "
            "histories replay on this build",
            self.label,
            WorkerDeploymentVersion(self.version.deployment_name, gone).to_canonical_string(),
            self.settings.task_queue,
            self.settings.takeover_after_s,
            gone,
        )
        return True

    async def _abandoned(self, client: Client) -> list[Run]:
        """Running workflows of the task queue pinned to another build of this deployment
        that no worker polls."""
        me = f"{self.version.deployment_name}:{self.version.build_id}"
        query = (
            f"TaskQueue = '{self.settings.task_queue}' AND ExecutionStatus = 'Running' AND "
            f"TemporalWorkerDeploymentVersion != '{me}'"
        )
        runs: list[Run] = []
        ages: dict[str, float] | None = None
        async for wf in client.list_workflows(query):
            if (wf.id, wf.run_id) in self.refused or (wf.id, wf.run_id) in self.moved:
                continue
            # the list's own record says where the run is; a describe only when it does not
            version = wf.raw_info.versioning_info.deployment_version
            if not version.build_id:
                desc = await client.get_workflow_handle(wf.id, run_id=wf.run_id).describe()
                version = (
                    desc.raw_description.workflow_execution_info.versioning_info.deployment_version
                )
            if version.deployment_name != self.version.deployment_name or not version.build_id:
                continue  # unversioned, or of another deployment
            if version.build_id == self.version.build_id:
                continue
            if ages is None:
                ages = await last_polls(
                    client, self.settings.task_queue, self.version.deployment_name
                )
            age = ages.get(version.build_id)
            if age is not None and age <= self.settings.takeover_after_s:
                continue  # its build still runs: it finishes there
            assert wf.run_id is not None
            runs.append(Run(wf.id, wf.run_id, wf.workflow_type, version.build_id))
        return runs

    async def _move_abandoned(self, client: Client) -> None:
        runs = await self._abandoned(client)
        if not runs:
            return
        gate = asyncio.Semaphore(REPLAY_CONCURRENCY)

        async def one(run: Run) -> bool:
            async with gate:
                return await self._move(client, run)

        moved = await asyncio.gather(*(one(r) for r in runs))
        builds = sorted({r.build_id for r in runs})
        log.warning(
            "moved %d of %d workflow(s) pinned to %s (no worker polls it) to %s after "
            "replaying their histories on this build",
            sum(moved),
            len(runs),
            ", ".join(builds),
            self.label,
        )

    async def _move(self, client: Client, run: Run) -> bool:
        handle = client.get_workflow_handle(run.workflow_id, run_id=run.run_id)
        try:
            history = await handle.fetch_history()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        result = await self.replayer.replay_workflow(history, raise_on_replay_failure=False)
        if result.replay_failure is not None:
            self.refused.add((run.workflow_id, run.run_id))
            log.error(
                "%s (run %s) is pinned to %s.%s, which no worker polls, and its history "
                "does not replay on %s (%s): left there. Start a worker of build %s to "
                "finish it, or end it with: temporal workflow terminate -w %s -r %s",
                run.workflow_id,
                run.run_id,
                self.version.deployment_name,
                run.build_id,
                self.label,
                result.replay_failure,
                run.build_id,
                run.workflow_id,
                run.run_id,
            )
            return False
        try:
            await self._override(client, run, pin=True)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:  # it ended meanwhile
                return False
            raise
        self.moved[(run.workflow_id, run.run_id)] = run
        log.info(
            "%s (run %s): moved from %s to %s",
            run.workflow_id,
            run.run_id,
            run.build_id,
            self.version.build_id,
        )
        if run.workflow_type in LOOPS:
            # a loop may wait for minutes: its next workflow task, here, moves it now
            try:
                await handle.signal("wake")
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
        return True

    async def _override(self, client: Client, run: Run, *, pin: bool) -> None:
        options = WorkflowExecutionOptions()
        if pin:
            options.versioning_override.CopyFrom(
                VersioningOverride(
                    pinned=VersioningOverride.PinnedOverride(
                        behavior=VersioningOverride.PINNED_OVERRIDE_BEHAVIOR_PINNED,
                        version=VersionProto(
                            deployment_name=self.version.deployment_name,
                            build_id=self.version.build_id,
                        ),
                    )
                )
            )
        await client.workflow_service.update_workflow_execution_options(
            UpdateWorkflowExecutionOptionsRequest(
                namespace=client.namespace,
                workflow_execution=WorkflowExecution(
                    workflow_id=run.workflow_id, run_id=run.run_id
                ),
                workflow_execution_options=options,
                update_mask=_OVERRIDE_MASK,
                identity=client.identity,
            )
        )

    async def _unpin_moved(self, client: Client) -> None:
        """Remove the override of each moved run once a workflow task of it completed on
        this build; follow a loop that continued-as-new (its next run inherits the
        override) and forget runs that ended."""
        for key, run in list(self.moved.items()):
            try:
                state = await self._state_here(client, run)
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
                state = ENDED
            if state == WAITING:
                continue
            del self.moved[key]
            if state == ENDED:
                continue
            if state == DONE_HERE:
                try:
                    await self._override(client, run, pin=False)
                except RPCError as exc:
                    if exc.status != RPCStatusCode.NOT_FOUND:
                        raise
                continue
            # continued as new: its next run carries the override
            follow = Run(run.workflow_id, state, run.workflow_type, run.build_id)
            self.moved[(follow.workflow_id, follow.run_id)] = follow

    async def _state_here(self, client: Client, run: Run) -> str:
        """DONE_HERE when the run's latest completed workflow task ran on this build,
        WAITING when none has yet, ENDED when the run has ended, and the next run's ID
        when it continued as new."""
        resp = await client.workflow_service.get_workflow_execution_history_reverse(
            GetWorkflowExecutionHistoryReverseRequest(
                namespace=client.namespace,
                execution=WorkflowExecution(workflow_id=run.workflow_id, run_id=run.run_id),
                maximum_page_size=50,
            )
        )
        for event in resp.history.events:
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                moved_on = event.workflow_execution_continued_as_new_event_attributes
                return moved_on.new_execution_run_id
            if event.event_type in _CLOSED:
                return ENDED
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                done = event.workflow_task_completed_event_attributes.deployment_version
                return DONE_HERE if done.build_id == self.version.build_id else WAITING
        return WAITING
