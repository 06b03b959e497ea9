"""Grows landing and just landed: while one does, no pod is launched for demand (and
after one landed, none is grown either). Ray publishes its demand list once a second, so
the work a grow is for may still be reported pending beside new work that the grown pod
could take once that work has run (issue #13: a task, then a placement group)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from raysize.workflows.model import ClusterSnapshot, KubeletResizeState, PodPhase

# A grow raysize asked for longer ago than this is stuck, not landing: launches go ahead.
LANDING_S = 10.0
# After a grow has landed, Ray may report the work it took as pending for a moment more
# (its demand list is published about once a second; later on a loaded head): grows and
# launches wait this long after a grow's saga finished (`plan(just_grown=...)`), about
# the period of Ray's own autoscaler loop.
JUST_GROWN_S = 5.0


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


@dataclass(slots=True)
class LaunchHold:
    """The grows landing (`landing_grows`) and just landed (`JUST_GROWN_S`) that hold
    launches for demand back, and whether they held one back."""

    landing: list[str]
    just_grown: list[str]  # also: no pod is grown (`bins.eligible_for_growth`)
    held_back: bool = False  # a launch for demand asked for room and got none

    @classmethod
    def of(cls, snap: ClusterSnapshot, just_grown: Sequence[str]) -> LaunchHold:
        landing = landing_grows(snap)
        running = {p.name for p in snap.pods if p.phase == PodPhase.RUNNING}
        return cls(landing, sorted((set(just_grown) & running) - set(landing)))

    def holds(self) -> bool:
        """Does it hold a launch for demand back now? (Recorded for `note_what_waits`.)"""
        if self.landing or self.just_grown:
            self.held_back = True
            return True
        return False
