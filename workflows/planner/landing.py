"""Grows landing and just landed. While one lands, no pod is launched for demand. After
one landed, Ray may still report the task demand it took as pending, until the GCS next
publishes the Raylets' loads (about once a second, docs/design/ray-protocol.md §5.8a): that
much task demand, no more than the room the grow opened (`taken_by_grows`), is not
planned for until then. Everything else (more task demand, placement groups,
`request_resources`) is planned at once (issue #13: a task, then a placement group;
issue #29: the group's grow came 5 s late behind a cluster-wide hold)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from raysize.workflows.model import ClusterSnapshot, Demand, KubeletResizeState, PodPhase, PodView
from raysize.workflows.planner.selectors import selector_matches
from raysize.workflows.resources import CPU, MEMORY, Resources

# A grow raysize asked for longer ago than this is stuck, not landing: launches go ahead.
LANDING_S = 10.0
# After a grow has landed, Ray may report the task demand it took as pending until its
# next demand publication (every 1.0004 s on Ray 2.60; later on a loaded head). The hold
# on that demand ends at the first publication the observe sees after the landing
# (`deadlines.GrowWatch`), or this long after the landing when none is seen (a GCS whose
# timetable is not known yet): the period of Ray's own autoscaler loop.
JUST_GROWN_S = 5.0
# The reconcile reads again this long after a landing (one publication period and a
# margin), when the hold usually ends; if no publication is known by then, JUST_GROWN_S.
PUBLICATION_WAIT_S = 1.2

# pod → the (millicores, bytes) its grow opened for work: what Ray may still report
GrownRoom = Mapping[str, tuple[int, int]]


def landing_grows(snap: ClusterSnapshot) -> list[str]:
    """Pods whose grow is landing: the pod has its new size and only its Raylet is
    catching up (`raylet_only`), or raysize asked the kubelet within LANDING_S and it is
    carrying the grow out. A pod with a failure on record grows no more."""
    return sorted(
        p.name
        for p in snap.pods
        if p.phase == PodPhase.RUNNING
        and not p.failed
        and (r := p.resize) is not None
        and r.state == KubeletResizeState.IN_PROGRESS
        and (r.cpu > p.total.cpu or r.memory > p.total.memory)
        and (r.raylet_only or (r.asked_s is not None and r.asked_s <= LANDING_S))
    )


@dataclass(frozen=True, slots=True)
class Taken:
    """Task demand a grow that just landed took: `count` units of `shape` on `pod`."""

    pod: str
    shape: Resources
    count: int


def grown_rooms(
    snap: ClusterSnapshot, just_grown: GrownRoom | Sequence[str]
) -> dict[str, tuple[int, int]]:
    """The room each just-grown running pod opened; a pod named alone (by name, as
    `scripts/planner_fingerprint.py` and older tests give them) is taken at its whole
    size, the most its work can be."""
    pods = {p.name: p for p in snap.pods if p.phase == PodPhase.RUNNING}
    if isinstance(just_grown, Mapping):
        return {n: room for n, room in just_grown.items() if n in pods}
    return {n: (pods[n].total.cpu, pods[n].total.memory) for n in just_grown if n in pods}


def _units(d: Demand, p: PodView, labels: Mapping[str, str], room: tuple[int, int]) -> int:
    """How many of `d`'s units the room a grow opened on `p` could have taken."""
    cpu, memory = d.shape.cpu, d.shape.memory
    if not (cpu or memory):
        return 0  # a grow adds CPU and memory only: it took no such work
    for name, amount in d.shape.items():
        if name not in (CPU, MEMORY) and p.total.get(name, 0) < amount:
            return 0  # the pod lacks the rest (a GPU, a custom resource)
    if d.label_selector and not selector_matches(d.label_selector, labels):
        return 0
    n = d.count
    if cpu:
        n = min(n, room[0] // cpu)
    if memory:
        n = min(n, room[1] // memory)
    return max(0, n)


def taken_by_grows(
    snap: ClusterSnapshot, demands: Sequence[Demand], rooms: GrownRoom
) -> tuple[list[Demand], list[Taken], dict[str, tuple[int, int]]]:
    """`demands` less what the grows in `rooms` may have taken (Ray reports it until its
    next publication), and what that is: on each pod, by name, as many units as its
    room holds, in the order Ray lists them. The rest is planned as any demand.

    With it, the room each pod may have free beyond what Ray reports (`doubt`): of its
    room that no listed demand accounts for, what Ray reports in use. The work the grow
    took is then running or done, and Ray reports a pod's free room on the same timer
    (measured: a pod grown to 2 CPU whose task had ended, its driver already waiting on
    a placement group, was reported with none free until the next publication, 0.92 s
    after it was seen grown). The work is counted once, as the demand Ray lists or as
    room in use; never twice (a second pod launched for a group the grown pod can hold,
    issue #13)."""
    left = [d.model_copy() for d in demands]
    taken: list[Taken] = []
    doubt: dict[str, tuple[int, int]] = {}
    pods = {p.name: p for p in snap.pods}
    for name in sorted(rooms):
        p = pods.get(name)
        if p is None:
            continue
        group = snap.groups.get(p.group)
        labels = {**(group.labels if group is not None else {}), **p.labels}
        cpu, memory = rooms[name]
        for i, d in enumerate(left):
            n = _units(d, p, labels, (cpu, memory))
            if n <= 0:
                continue
            taken.append(Taken(name, d.shape, n))
            left[i] = d.model_copy(update={"count": d.count - n})
            cpu -= n * d.shape.cpu
            memory -= n * d.shape.memory
        free = p.available
        room_cpu, room_memory = rooms[name]
        doubt[name] = (
            max(0, min(cpu, room_cpu - free.cpu)),
            max(0, min(memory, room_memory - free.memory)),
        )
    return [d for d in left if d.count > 0], taken, doubt


@dataclass(slots=True)
class LaunchHold:
    """The grows landing (`landing_grows`) that hold launches for demand back, and
    whether they held one back; the task demand the grows just landed took
    (`taken_by_grows`), which is not planned for."""

    landing: list[str]
    taken: list[Taken] = field(default_factory=list)
    # pod → room (millicores, bytes) its grow's work may have left already, beyond what
    # Ray reports free: it may not report it yet (`taken_by_grows`)
    doubt: dict[str, tuple[int, int]] = field(default_factory=dict)
    held_back: bool = False  # a launch for demand asked for room and got none

    def holds(self) -> bool:
        """Does it hold a launch for demand back now? (Recorded for `note_what_waits`.)"""
        if self.landing:
            self.held_back = True
            return True
        return False
