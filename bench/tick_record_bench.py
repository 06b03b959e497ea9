"""How big a tick's records are at thousands of idle pods: `python -m bench.tick_record_bench`.

    python -m bench.tick_record_bench [--sizes 5000,10000]

For each size, an idle cluster: one worker group of that many running pods, every one
idle past the idle timeout, nothing pending (so the plan removes pods, and nothing
else). The tick is decided as the observe activity decides it (`workflows/decide.py`
`decide`, with the reconcile's resize budget), and the records it makes in the reconcile
workflow's history are encoded as Temporal's data converter encodes them (raysize's
pydantic converter, the `Payload` protobuf's size): the tick itself (the observe's
result, recorded in its marker), the drain's input and result, and the RayCluster
write's input (`ScaleInput`), as the workflow builds them from the tick.

Each record must stay under `MAX_RECORD_BYTES` (512 KB), far below Temporal's 2 MB
payload limit: a record over that limit can never be written, and the loop is stuck on
that tick. Before removals were capped per tick (issue #43 item 4), 5,000 removals made a
1.49 MB tick and about 7,000 went past 2 MB. Pure and quick (no server): the same code is
`tests/bench/test_tick_record_bench.py`'s.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from temporalio.contrib.pydantic import pydantic_data_converter

from raysize.workflows.contracts import (
    DrainInput,
    DrainResult,
    DrainTarget,
    Observation,
    ObserveInput,
    ReconcileInput,
    ScaleInput,
    Tick,
)
from raysize.workflows.decide import decide
from raysize.workflows.model import (
    ClusterSnapshot,
    GroupSpec,
    PlannerSettings,
    PodPhase,
    PodView,
)
from raysize.workflows.reconcile_workflow import scale_request
from raysize.workflows.resources import GIB, Resources

SIZES = (5_000, 10_000)
MAX_RECORD_BYTES = 512 * 1024
NS, CLUSTER, GROUP = "bench", "big", "cpu"
IDLE_TIMEOUT_S = 60.0


def idle_cluster(pods: int) -> ClusterSnapshot:
    """A head and `pods` running workers of one group (4 CPU, 16 GiB), each idle for
    10 minutes (past the 60 s idle timeout), named as KubeRay names them, each with a
    UID and a Raylet id as long as the real ones."""
    size = Resources.of(cpu=4000, memory=16 * GIB)
    head = PodView(
        name=f"{CLUSTER}-head-x7k2p",
        group="headgroup",
        phase=PodPhase.RUNNING,
        raylet_id="f" * 56,
        uid="00000000-0000-4000-8000-000000000000",
        total=Resources.of(memory=8 * GIB),
        available=Resources.of(memory=8 * GIB),
    )
    workers = tuple(
        PodView(
            name=f"{CLUSTER}-{GROUP}-worker-{i:05x}",
            group=GROUP,
            phase=PodPhase.RUNNING,
            raylet_id=f"{i:056x}",
            uid=f"{i:08x}-0000-4000-8000-{i:012x}",
            total=size,
            available=size,
            idle_s=600.0,
        )
        for i in range(pods)
    )
    groups = {
        "headgroup": GroupSpec(
            name="headgroup", resources=Resources.of(memory=8 * GIB), is_head=True
        ),
        GROUP: GroupSpec(
            name=GROUP,
            resources=size,
            min_workers=0,
            max_workers=2 * pods,
            labels={"ray.io/node-group": GROUP},
        ),
    }
    return ClusterSnapshot(
        name=CLUSTER,
        groups=groups,
        pods=(head, *workers),
        settings=PlannerSettings(idle_timeout_s=IDLE_TIMEOUT_S),
    )


def payload_bytes(value: object) -> int:
    """`value` as Temporal's data converter (raysize's, pydantic) encodes it: the size of
    its `Payload`, which is what a history event carries."""
    (payload,) = pydantic_data_converter.payload_converter.to_payloads([value])
    return payload.ByteSize()


@dataclass(frozen=True)
class TickRecords:
    pods: int
    removals: int  # the removals the tick carries out
    planned_out: int  # removals the planner wanted and the tick left to later ticks
    tick: int  # bytes: the observe's result (`Tick`)
    drain_input: int
    drain_result: int
    scale_input: int

    @property
    def largest(self) -> int:
        return max(self.tick, self.drain_input, self.drain_result, self.scale_input)

    def line(self) -> str:
        kb = 1024
        verdict = "met" if self.largest <= MAX_RECORD_BYTES else "MISSED"
        return (
            f"pods={self.pods} removals={self.removals} left_for_later={self.planned_out} "
            f"tick={self.tick / kb:.1f}KB drain_input={self.drain_input / kb:.1f}KB "
            f"drain_result={self.drain_result / kb:.1f}KB "
            f"scale_input={self.scale_input / kb:.1f}KB "
            f"largest={self.largest / kb:.1f}KB target<={MAX_RECORD_BYTES // kb}KB {verdict}"
        )


def tick_records(pods: int) -> TickRecords:
    """Decide one tick of an idle cluster of `pods` pods and measure its records."""
    snap = idle_cluster(pods)
    budget = ReconcileInput(namespace=NS, cluster=CLUSTER).max_concurrent_resizes
    obs = Observation(
        snapshot=snap,
        gcs_address=f"{CLUSTER}-head-svc.{NS}.svc:6379",
        replicas={GROUP: pods},
        generation=7,
    )
    inp = ObserveInput(namespace=NS, cluster=CLUSTER, now=1.0e9, max_resizes=budget)
    tick: Tick = decide(obs, inp)
    assert tick.plan is not None
    p = tick.plan
    # what the reconcile builds from the tick (`ReconcileWorkflow._drain`, `_scale`)
    drain = DrainInput(
        namespace=NS,
        cluster=CLUSTER,
        gcs_address=tick.gcs_address,
        targets=tuple(
            DrainTarget(
                pod=t.pod, node_id=tick.refs[t.pod].raylet_id, reason=f"raysize: {t.reason}"
            )
            for t in sorted(p.terminate, key=lambda t: t.pod)
        ),
    )
    drained = DrainResult(accepted=tuple(t.pod for t in drain.targets))
    replicas, to_delete = scale_request(tick, p)
    scale = ScaleInput(
        namespace=NS,
        cluster=CLUSTER,
        replicas=replicas,
        workers_to_delete=to_delete,
        generation=tick.generation,
        pod_uids={n: tick.refs[n].uid for names in to_delete.values() for n in names},
    )
    idle = sum(1 for x in snap.pods if x.idle_s >= IDLE_TIMEOUT_S and x.group == GROUP)
    return TickRecords(
        pods=pods,
        removals=len(p.terminate),
        planned_out=idle - len(p.terminate),
        tick=payload_bytes(tick),
        drain_input=payload_bytes(drain),
        drain_result=payload_bytes(drained),
        scale_input=payload_bytes(scale),
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        default=",".join(str(n) for n in SIZES),
        help="pods per cluster, comma-separated",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    ok = True
    for pods in (int(s) for s in args.sizes.split(",")):
        records = tick_records(pods)
        print(records.line(), flush=True)
        ok = ok and records.largest <= MAX_RECORD_BYTES
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
