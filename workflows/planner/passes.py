"""`plan()`: the passes, in order, over one `PlanContext` and its `Ledger`."""

from __future__ import annotations

from collections.abc import Sequence

from raysize.workflows.model import MAX_PLAN_UNITS, ClusterSnapshot, Plan, bounded, plan_units
from raysize.workflows.planner.constraints import place_constraints
from raysize.workflows.planner.context import PlanContext
from raysize.workflows.planner.demands import carry_over_to_free_room, place_demands_and_gangs
from raysize.workflows.planner.grows import grow_actions
from raysize.workflows.planner.idle import (
    launch_for_what_waits,
    remove_idle_and_launch_for_what_waits,
)
from raysize.workflows.planner.landing import GrownRoom
from raysize.workflows.planner.min_max import enforce_max, enforce_min
from raysize.workflows.planner.outcome import (
    leave_grouped_tasks_to_their_groups,
    note_what_waits,
    to_plan,
)
from raysize.workflows.planner.replace_silent import replace_silent_pods
from raysize.workflows.planner.smaller_launches import smaller_launches
from raysize.workflows.planner.work import Ledger


def run(
    snapshot: ClusterSnapshot, *, just_grown: GrownRoom | Sequence[str] = ()
) -> tuple[Plan, PlanContext, Ledger]:
    """One plan, pass by pass; with its context and ledger (for `plan_with_trace`)."""
    ctx = PlanContext(*_bound(snapshot), just_grown=just_grown)
    replace_silent_pods(ctx)
    enforce_min(ctx)
    enforce_max(ctx)
    ledger = place_constraints(ctx)
    carry_over_to_free_room(ctx, ledger)
    place_demands_and_gangs(ctx, ledger)
    resizes = grow_actions(ctx, ledger)
    remove_idle_and_launch_for_what_waits(ctx, ledger, resizes)
    leave_grouped_tasks_to_their_groups(ctx)
    known = len(ledger.free_bins)
    if smaller_launches(ctx, ledger.free_bins):
        # a pod moved to a smaller group leaves room under its first group's maximum,
        # which work that only that group takes may have found full
        launch_for_what_waits(ctx, ledger)
        smaller_launches(ctx, ledger.free_bins[known:])
    note_what_waits(ctx, ledger)
    return to_plan(ctx, ledger, resizes), ctx, ledger


def plan(snapshot: ClusterSnapshot, *, just_grown: GrownRoom | Sequence[str] = ()) -> Plan:
    """Decide one reconcile tick. Pure: the same inputs always give the same plan.
    `just_grown`: pods whose grow landed moments ago, before Ray's next demand
    publication (the reconcile workflow's memory, `deadlines.GrowWatch`, not in the
    snapshot), each with the room (millicores, bytes) it opened, or by name alone (its
    whole size): up to that room, task demand Ray lists is taken to be the work the grow
    took, and is not planned for (`landing.taken_by_grows`)."""
    return run(snapshot, just_grown=just_grown)[0]


def _bound(snapshot: ClusterSnapshot) -> tuple[ClusterSnapshot, str]:
    """At most MAX_PLAN_UNITS units a plan, and a note saying what waits."""
    cut, left_out = bounded(snapshot)
    if not left_out:
        return snapshot, ""
    return cut, (
        f"{left_out} of {plan_units(snapshot)} pending units wait for the next plan: one plan "
        f"places at most {MAX_PLAN_UNITS} (tasks first, then placement groups, then "
        "request_resources)"
    )
