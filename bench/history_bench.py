"""What a reconcile tick adds to the workflow history: `python -m bench.history_bench`.

Runs the real ReconcileWorkflow on the Temporal dev server against generated clusters of
200, 2,000 and 5,000 pods (`bench.plan_bench.generate`; the observe activity plans on
the snapshot with the product's own `workflows/decide.py`, as the real one does) and
measures the history's bytes per tick, event by event (the size of each event's protobuf
encoding, which is what the server stores and the 50 MB history limit counts):

- a quiet tick: nothing to do (no demand, no idle pod): what a cluster costs every tick;
- a busy tick: the generated demand and idle pods, its plan recorded in full, with the
  sagas, drains and RayCluster write it leads to (`--budget` resizes at most).

Target (issue #27): a 5,000-pod cluster's tick adds ≤ 64 KB. 0.1 recorded the whole
snapshot in every observe result: about 1.3 MB at 2,000 pods, and `PayloadsTooLarge` (the
2 MB limit of one payload) at about 4,000.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import uuid
from dataclasses import dataclass
from typing import Any

from temporalio import activity, workflow
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bench.histories import local_activity, runs, task_of
from bench.plan_bench import generate
from bench.procs import start_dev_server
from raysize.worker.scenario import load_scenario
from raysize.workflows.contracts import (
    Act,
    DrainInput,
    DrainResult,
    EventInput,
    Observation,
    ObserveInput,
    ReconcileInput,
    ResizeOutcome,
    ResizePhase,
    ResizeRequest,
    ResizeSagaState,
    ScaleInput,
    Tick,
    WaitInput,
)
from raysize.workflows.decide import decide
from raysize.workflows.model import ClusterSnapshot
from raysize.workflows.naming import RESIZE_WORKFLOW
from raysize.workflows.reconcile_workflow import ReconcileWorkflow

SIZES = (200, 2_000, 5_000)
TARGET_BYTES = 64 * 1024


def cluster(pods: int, *, busy: bool) -> ClusterSnapshot:
    doc: dict[str, Any] = generate(pods, pods * 10)
    if not busy:
        doc = {**doc, "demands": [], "gangs": [], "constraints": []}
        doc["pods"] = [{**p, "idle_s": 0} for p in doc["pods"]]
    snap = load_scenario(doc)
    # every pod that exists has a UID, as Kubernetes gives it
    return snap.model_copy(
        update={"pods": tuple(p.model_copy(update={"uid": str(uuid.uuid4())}) for p in snap.pods)}
    )


@workflow.defn(name=RESIZE_WORKFLOW)
class SagaStandIn:
    """Takes the reconcile's resize sagas (their start is what the parent's history
    records) and ends at once: this benchmark measures the reconcile loop."""

    @workflow.run
    async def run(self, req: ResizeRequest) -> ResizeSagaState:
        return ResizeSagaState(
            pod=req.pod,
            phase=ResizePhase.DONE,
            outcome=ResizeOutcome.SUCCEEDED,
            from_cpu=req.from_cpu,
            from_memory=req.from_memory,
            cpu=req.cpu,
            memory=req.memory,
        )


@dataclass
class World:
    snapshot: ClusterSnapshot
    ticks: int = 0

    def activities(self) -> list[Any]:
        @activity.defn(name=Act.OBSERVE)
        async def observe(inp: ObserveInput) -> Tick:
            self.ticks += 1
            obs = Observation(
                snapshot=self.snapshot,
                replicas={
                    g: sum(1 for p in self.snapshot.pods if p.group == g)
                    for g in self.snapshot.groups
                },
                gcs_address="127.0.0.1:6379",
                gcs_version=self.ticks,
                pods_version=str(self.ticks),
            )
            return await asyncio.to_thread(decide, obs, inp)

        @activity.defn(name=Act.WAIT_FOR_CHANGE)
        async def wait(inp: WaitInput) -> bool:
            await asyncio.sleep(0.05)
            return True

        @activity.defn(name=Act.DRAIN)
        async def drain(inp: DrainInput) -> DrainResult:
            return DrainResult(accepted=tuple(t.pod for t in inp.targets))

        @activity.defn(name=Act.SCALE)
        async def scale(inp: ScaleInput) -> None:
            return None

        @activity.defn(name=Act.EVENT)
        async def event(inp: EventInput) -> None:
            return None

        return [observe, wait, drain, scale, event]


def _size(event: HistoryEvent) -> int:
    return len(event.SerializeToString())


async def _chain(client: Client, wf_id: str, run_id: str) -> list[HistoryEvent]:
    """The events of every run of the workflow, from `run_id` on through its
    continue-as-new (a busy tick can make the server suggest one)."""
    return [e for history in await runs(client, wf_id, run_id) for e in history.events]


async def measure(client: Client, pods: int, *, busy: bool, budget: int) -> tuple[int, int, int]:
    """(bytes of the first tick, bytes per later tick, ticks): a tick is everything from
    the scheduling of the workflow task that observed (the observe is a local activity)
    to the next such task's."""
    world = World(cluster(pods, busy=busy))
    queue = f"history-{uuid.uuid4()}"
    wf_id = f"reconcile/bench/{pods}-{'busy' if busy else 'quiet'}-{uuid.uuid4().hex[:6]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[ReconcileWorkflow, SagaStandIn],
        activities=world.activities(),
        # the stand-in saga lives in this module, which the sandbox would re-import
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        handle = await client.start_workflow(
            ReconcileWorkflow.run,
            ReconcileInput(
                namespace="bench", cluster=f"c{pods}", tick_s=60, max_concurrent_resizes=budget
            ),
            id=wf_id,
            task_queue=queue,
        )
        while world.ticks < 6:
            await asyncio.sleep(0.1)
        await handle.terminate("measured")
        events = await _chain(client, wf_id, handle.first_execution_run_id or "")
    # each tick from the scheduling of the workflow task that observed (a local activity)
    starts = [
        task_of(events, i)[0] for i, e in enumerate(events) if local_activity(e) == Act.OBSERVE
    ]
    sizes = [sum(_size(e) for e in events[a:b]) for a, b in itertools.pairwise(starts)]
    later = sizes[1:] or sizes
    return sizes[0], max(later), len(sizes)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="pod counts")
    parser.add_argument("--budget", type=int, default=100, help="max_concurrent_resizes")
    args = parser.parse_args()
    env = await start_dev_server()
    try:
        for pods in (int(x) for x in args.sizes.split(",")):
            quiet_first, quiet, n = await measure(env.client, pods, busy=False, budget=args.budget)
            busy_first, busy_later, _ = await measure(
                env.client, pods, busy=True, budget=args.budget
            )
            verdict = "ok" if max(quiet_first, quiet) <= TARGET_BYTES else "OVER"
            print(
                f"pods={pods} quiet_tick_bytes={quiet} (first {quiet_first}, {n} ticks) "
                f"target<={TARGET_BYTES} {verdict} | busy_first_tick_bytes={busy_first} "
                f"busy_later_tick_bytes={busy_later} (resize budget {args.budget})",
                flush=True,
            )
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
