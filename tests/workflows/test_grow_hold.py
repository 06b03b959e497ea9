"""Issue #29: after a grow lands, only the task demand it took is held, and only until
Ray publishes its demand again (`landing.taken_by_grows`, `deadlines.GrowWatch`).

The workload: one 1-CPU worker (its group may grow to 8), a `{CPU: 2}` task (w1 grows
1 → 2 CPU and runs it), then a PACK placement group of 2 × `{CPU: 2}`. Until Ray's next
demand publication (every 1.0004 s, docs/design/ray-protocol.md §5.8a) it still lists the task.
"""

from __future__ import annotations

from typing import Any

import pytest

from raysize.workflows.contracts import Memory, Observation, ObserveInput, Tick
from raysize.workflows.deadlines import MARGIN_S, GrowWatch
from raysize.workflows.decide import decide
from raysize.workflows.model import (
    Gang,
    GangStrategy,
    GroupSpec,
    KubeletResizeState,
    Plan,
    PodResize,
    PodView,
    ResizeAction,
)
from raysize.workflows.planner import JUST_GROWN_S, PUBLICATION_WAIT_S, plan
from raysize.workflows.resources import GIB, Resources
from tests.workflows.kit import group, pod, res, snapshot

T0 = 1000.0  # the workflow's clock when the grow started
LANDED = T0 + 2.0  # ... and the observe that saw it landed
TASK = res(2)
PG = Gang(bundles=(TASK, TASK), strategy=GangStrategy.PACK)


def g1() -> GroupSpec:
    return group(max_cpu=8, max_mem_gib=8)


def grown(cpu: float = 2, free_cpu: float = 0) -> PodView:
    """w1 at its grown size, running the task it grew for."""
    return pod("w1", cpu=cpu, free_cpu=free_cpu)


def tick(
    demands: list[tuple[Resources, int]],
    gangs: tuple[Gang, ...] = (),
    memory: Memory | None = None,
    now: float = LANDED,
    **obs: Any,
) -> Tick:
    snap = snapshot([g1()], [grown()], demands, gangs=gangs)
    inp = ObserveInput(namespace="ns", cluster="c", now=now, memory=memory or growing())
    return decide(Observation(snapshot=snap, gcs_address="h:6379", **obs), inp)


def growing(**more: object) -> Memory:
    """The reconcile's memory after it started w1's grow 1 → 2 CPU (as on main: no room
    on record, so w1's whole size is the most the grow can have taken)."""
    return Memory(growing={"w1": (1000, 2 * GIB, T0)}, **more)


def grows(p: Plan | None) -> dict[str, int]:
    assert p is not None
    return {r.pod: r.cpu for r in p.resize}


def test_the_placement_group_after_the_task_is_planned_in_the_tick_the_grow_lands() -> None:
    """The group's grow comes in the same tick as the first grow is seen landed (it
    came 5 s later, behind the cluster-wide hold, and the group was ready 5.2 s after
    it was submitted where Ray's own autoscaler took 0.4–0.8 s). The task Ray still
    lists is not grown for: w1 goes to 2 + 4 CPU, not 2 + 2 + 4."""
    t = tick([(TASK, 1)], (PG,))
    assert grows(t.plan) == {"w1": 6000}, t.plan
    assert t.plan is not None and t.plan.launch == ()
    assert "w1" in t.memory.landed  # the task is still held


def test_when_ray_lists_the_task_no_more_the_room_it_took_may_be_free() -> None:
    """The task ended and its driver submitted the group, and Ray still reports w1 with
    no room free (it reports a pod's room on the same timer as demand: seen for 0.92 s
    in the e2e run): the task is counted once, so the group takes w1 grown to its
    maximum of 4, and no second pod is launched (issue #13)."""
    snap = snapshot([group(max_cpu=4)], [grown()], [], gangs=(PG,))
    inp = ObserveInput(namespace="ns", cluster="c", now=LANDED, memory=growing())
    t = decide(Observation(snapshot=snap, gcs_address="h:6379"), inp)
    assert grows(t.plan) == {"w1": 4000}, t.plan
    assert t.plan is not None and t.plan.launch == ()
    # the hold over, w1 still reported busy: its task runs, and a pod is launched
    t = decide(
        Observation(snapshot=snap, gcs_address="h:6379"),
        inp.model_copy(update={"memory": Memory()}),
    )
    assert t.plan is not None and t.plan.launch_by_group == {"g1": 1}


def test_a_task_equal_to_what_the_grow_took_is_neither_grown_nor_launched_for() -> None:
    """The over-grow the hold prevents: the task the grow took, still listed by Ray, is
    not placed again; status says a grow took it, not that it cannot be placed."""
    for memory in (growing(), growing(grow_used={"w1": (0, 0)})):
        t = tick([(TASK, 1)], memory=memory)
        assert t.plan is not None and t.plan.is_empty, t.plan
        assert not any("cannot place" in n for n in t.plan.notes)
        assert any(
            "1 × {CPU: 2} held just after the grow of w1 landed, which took it" in n
            for n in t.plan.notes
        ), t.plan.notes
    # a busy pod (1 CPU of its work running) grown 1 → 3 for the task: its room is 2 CPU
    busy = pod("w1", cpu=3, free_cpu=0)
    memory = growing(grow_used={"w1": (1000, 0)})
    snap = snapshot([g1()], [busy], [(TASK, 2)])
    inp = ObserveInput(namespace="ns", cluster="c", now=LANDED, memory=memory)
    t = decide(Observation(snapshot=snap, gcs_address="h:6379"), inp)
    assert grows(t.plan) == {"w1": 5000}  # the second task only


def test_task_demand_beyond_what_the_grow_took_is_planned_at_once() -> None:
    # 1 × {CPU: 2} is the task w1 took; 2 more arrived: w1 grows by 4 CPU for them now
    t = tick([(TASK, 3)])
    assert grows(t.plan) == {"w1": 6000}, t.plan
    # more than w1 can grow for: a pod is launched for the rest, and other pods grow
    other = pod("w2", free_cpu=0)
    snap = snapshot([g1()], [grown(), other], [(TASK, 8)])
    inp = ObserveInput(namespace="ns", cluster="c", now=LANDED, memory=growing())
    t = decide(Observation(snapshot=snap, gcs_address="h:6379"), inp)
    assert t.plan is not None
    assert grows(t.plan) == {"w1": 8000, "w2": 7000}  # 3 + 3 tasks
    assert t.plan.launch_by_group == {"g1": 1}  # the 8th
    # what the grow opened is what it may have taken: a GPU task, which w1 cannot run,
    # is not held
    gpu = plan(snapshot([g1()], [grown()], [(res(2, GPU=1), 1)]), just_grown={"w1": (2000, 0)})
    assert not any("held just after" in n for n in gpu.notes)


def test_the_hold_ends_at_the_first_publication_after_the_landing() -> None:
    """Not 5 s: once the observe knows Ray published its demand after the read that saw
    the grow landed, what Ray lists is new work, and is planned."""
    seen_at = 5_000.0  # the observe's clock (epoch s) when that read was answered
    t = tick([(TASK, 1)], ray_read_at=seen_at, demand_published=(seen_at - 0.6, seen_at - 0.59))
    assert t.plan is not None and t.plan.is_empty  # held
    assert t.memory.landed_seen == {"w1": seen_at}
    assert t.next_decision_in == pytest.approx(PUBLICATION_WAIT_S)  # looks again then
    # 0.9 s later: the last publication was before the landing was seen: still held
    later = t.memory
    before = (seen_at - 0.1, seen_at - 0.09)
    t = tick([(TASK, 1)], memory=later, now=LANDED + 0.9, demand_published=before)
    assert t.plan is not None and t.plan.is_empty
    # 1.2 s later: Ray published at seen_at + 0.4 and still lists a {CPU: 2} task: a new one
    after = (seen_at + 0.4, seen_at + 0.41)
    t = tick([(TASK, 1)], memory=later, now=LANDED + 1.2, demand_published=after)
    assert grows(t.plan) == {"w1": 4000}
    assert t.memory.landed == {} and t.memory.landed_seen == {}


def test_without_a_known_publication_the_hold_lasts_just_grown_s() -> None:
    watch = GrowWatch(growing={"w1": (1000, 2 * GIB, T0)})
    snap = snapshot([g1()], [grown()])
    assert watch.observe(snap, [], LANDED, read_at=5_000.0) == ["w1"]
    assert watch.due_in(LANDED) == pytest.approx(PUBLICATION_WAIT_S)
    assert watch.observe(snap, [], LANDED + 2, read_at=5_002.0) == ["w1"]
    assert watch.due_in(LANDED + 2) == pytest.approx(JUST_GROWN_S - 2 + MARGIN_S)
    assert watch.observe(snap, [], LANDED + JUST_GROWN_S) == []
    # the room is what the pod runs beyond what it ran when the grow was planned
    watch = GrowWatch(growing={"w1": (1000, 2 * GIB, T0)})
    watch.planned(snapshot([g1()], [pod("w1", free_cpu=0.5)]), Plan(resize=(_grow(),)))
    assert watch.used == {"w1": (500, 0)}
    assert watch.observe(snap, [], LANDED) == ["w1"]
    assert watch.rooms(snap) == {"w1": (1500, 2 * GIB)}


def _grow() -> ResizeAction:
    return ResizeAction(
        pod="w1", group="g1", cpu=2000, memory=2 * GIB, from_cpu=1000, from_memory=2 * GIB,
        reason="r",
    )  # fmt: skip


def test_demand_that_waits_for_a_grow_in_flight_is_not_called_unplaceable() -> None:
    """While w1's grow lands no pod is launched: status says the demand waits for it."""
    inflight = PodResize(
        cpu=4000, memory=2 * GIB, state=KubeletResizeState.IN_PROGRESS, asked_s=0.5
    )
    landing = pod("w1", resize=inflight)
    big = Gang(bundles=(res(4), res(4)), strategy=GangStrategy.PACK)
    p = plan(snapshot([group()], [landing], [(TASK, 3)], gangs=(big,)))
    assert p.launch == () and p.resize == ()
    assert any(n.startswith("waits for the grow landing: ") for n in p.notes), p.notes
    assert any("placement group(s) wait for the grow landing" in n for n in p.notes), p.notes
    assert not any("cannot" in n for n in p.notes), p.notes
