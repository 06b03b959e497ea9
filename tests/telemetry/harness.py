"""A scripted reconcile → resize run for telemetry tests, on a client of our choosing
(with raysize's interceptors, a traced tracer, a metrics runtime)."""

from __future__ import annotations

import uuid
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from raysize.workflows.contracts import (
    Act,
    FinishResizeInput,
    FinishResizeResult,
    ReconcileInput,
    ResizeSagaState,
)
from raysize.workflows.reconcile_workflow import ReconcileWorkflow
from raysize.workflows.resize_workflow import PodResizeWorkflow
from tests.orchestration.fake_world import FakeWorld
from tests.orchestration.test_reconcile_workflow import ResizeRecorder, until
from tests.workflows.kit import group, pod, res, snapshot


class FlakyRaylet(ResizeRecorder):
    """The resize saga's activities; the Raylet refuses its first `failures` syncs."""

    def __init__(self, world: FakeWorld, failures: int = 0) -> None:
        super().__init__(world)
        self.failures = failures
        self.raylet_attempts = 0

    def workflow_activities(self) -> list[object]:
        others = [
            a
            for a in super().workflow_activities()
            if getattr(a, "__name__", "") != "finish"  # ResizeRecorder's Raylet sync stand-in
        ]

        @activity.defn(name=Act.FINISH_RESIZE)
        async def finish(inp: FinishResizeInput) -> FinishResizeResult:
            self.raylet_attempts += 1
            if self.failures > 0:
                self.failures -= 1
                raise ApplicationError("GCS unavailable", type="RayUnavailable")
            self.world.resized(inp.pod, inp.cpu, inp.memory)
            self.world.resizing.discard(inp.pod)
            return FinishResizeResult(cpu=inp.cpu, memory=inp.memory)

        return [*others, finish]


def growing_world() -> FakeWorld:
    """One worker pod of 1 CPU, and a task that needs 2: the plan grows w1."""
    return FakeWorld(snapshot([group()], [pod("w1")], [(res(2), 1)]))


def with_interceptors(client: Client, interceptors: list[Any]) -> Client:
    """The same connection with raysize's interceptors added (after the test server's own,
    which skips time while a result is awaited)."""
    config = client.config()
    config["interceptors"] = [*config["interceptors"], *interceptors]
    return Client(**config)


async def reconcile_one_resize(
    client: Client,
    world: FakeWorld,
    saga: ResizeRecorder,
    namespace: str | None = None,
    *,
    cached: bool = True,
) -> tuple[str, ResizeSagaState]:
    """Run the reconcile loop until the resize of w1 it starts has finished; returns the
    namespace used and the resize's final state."""
    queue = f"q-{uuid.uuid4()}"
    ns = namespace or f"ns-{uuid.uuid4().hex[:6]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[ReconcileWorkflow, PodResizeWorkflow],
        activities=[*world.activities(), *saga.workflow_activities()],
        max_cached_workflows=1000 if cached else 0,  # 0: every workflow task replays
    ):
        handle = await client.start_workflow(
            ReconcileWorkflow.run,
            ReconcileInput(namespace=ns, cluster="demo", tick_s=0.5),
            id=f"reconcile/{ns}/demo",
            task_queue=queue,
        )
        try:
            await until(lambda: world.resizing or world.observed > 3)
            child = client.get_workflow_handle_for(PodResizeWorkflow.run, f"resize/{ns}/w1")
            state = await child.result()
            # the tick that started it records its event after the child started
            await until(lambda: any(e.reason == "Reconciled" for e in world.events))
        finally:
            await handle.terminate("test over")
    return ns, state
