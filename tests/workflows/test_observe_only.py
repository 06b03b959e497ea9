"""Observe-only (RAYSIZE_OBSERVE_ONLY) in the decision layer (`workflows/decide.py`, pure):
the tick has nothing to act on, says what it would have done, and says each action once."""

from __future__ import annotations

from raysize.workflows.contracts import Memory, Observation, ObserveInput, Tick
from raysize.workflows.decide import (
    MAX_EVENT_MESSAGE,
    NOTHING_CHANGED,
    WOULD_RESIZE,
    WOULD_SCALE_IN,
    WOULD_SCALE_OUT,
    WOULD_SETTLE,
    decide,
    would_do,
)
from raysize.workflows.model import KubeletResizeState, Plan, PodResize, TerminateAction
from raysize.workflows.resources import GIB
from tests.workflows.kit import group, pod, res, snapshot


def _inp(memory: Memory | None = None, now: float = 1000.0) -> ObserveInput:
    return ObserveInput(namespace="ns", cluster="c", now=now, memory=memory or Memory())


def _busy_and_idle(idle_s: float = 120, demand_cpu: float = 2) -> Observation:
    """w1 runs work and can grow for a 2-CPU task; w2 has been idle past the timeout."""
    snap = snapshot(
        [group()],
        [pod("w1", free_cpu=0, uid="u1"), pod("w2", idle_s=idle_s, uid="u2")],
        [(res(demand_cpu), 1)],
    )
    return Observation(snapshot=snap, gcs_address="h:6379", replicas={"g1": 2})


def _events(tick: Tick) -> dict[str, str]:
    assert tick.would is not None
    return {e.reason: e.message for e in tick.would.events}


def test_observe_only_plans_as_usual_and_leaves_nothing_to_act_on() -> None:
    obs = _busy_and_idle()
    acting = decide(obs, _inp())
    assert acting.plan is not None and not acting.observe_only and acting.would is None
    tick = decide(obs, _inp(), observe_only=True)
    # nothing the workflow could act on: no plan, no settles, no pods named for a write
    assert tick.observe_only and tick.plan is None and tick.stuck == () and tick.refs == {}
    # what it would have done is the plan it made, whole
    assert tick.would is not None and tick.would.plan == acting.plan
    assert [r.pod for r in acting.plan.resize] == ["w1"]
    assert [t.pod for t in acting.plan.terminate] == ["w2"]
    assert tick.would.lines[0].startswith("would grow w1 1 → 3 CPU: ")
    assert tick.would.lines[1].startswith("would remove w2: ")
    events = _events(tick)
    assert set(events) == {WOULD_RESIZE, WOULD_SCALE_IN}
    assert events[WOULD_RESIZE].startswith(f"{NOTHING_CHANGED}: would grow w1 1 → 3 CPU")
    assert events[WOULD_SCALE_IN].startswith(f"{NOTHING_CHANGED}: would remove w2")
    # the loop's memory goes on as usual (since when demand waits), with what was said
    assert tick.memory.demand_seen_at == 1000.0
    assert tick.memory.reported == ("remove w2", f"resize w1 3000 {2 * GIB}")
    assert tick.next_decision_in == acting.next_decision_in


def test_an_unchanged_plan_is_said_once_and_a_changed_one_again() -> None:
    first = decide(_busy_and_idle(), _inp(), observe_only=True)
    # next tick: the same plan, in other words (w2 idle longer): no Event
    again = decide(_busy_and_idle(idle_s=300), _inp(first.memory, 1100.0), observe_only=True)
    assert again.would is not None and again.would.lines and again.would.events == ()
    assert again.memory.reported == first.memory.reported
    # more demand: a bigger grow is new (and said), the removal is not said again
    more = decide(
        _busy_and_idle(idle_s=300, demand_cpu=3), _inp(again.memory, 1200.0), observe_only=True
    )
    events = _events(more)
    assert set(events) == {WOULD_RESIZE}
    assert "would grow w1 1 → 4 CPU" in events[WOULD_RESIZE]
    # an action that went away and comes back is said again
    gone = decide(
        Observation(snapshot=snapshot([group()], [pod("w1")]), gcs_address="h:6379"),
        _inp(more.memory, 1300.0),
        observe_only=True,
    )
    assert gone.would is not None and gone.would.lines == () and gone.memory.reported == ()
    back = decide(_busy_and_idle(), _inp(gone.memory, 1400.0), observe_only=True)
    assert set(_events(back)) == {WOULD_RESIZE, WOULD_SCALE_IN}


def test_switched_off_it_acts_again_and_forgets_what_it_said() -> None:
    said = decide(_busy_and_idle(), _inp(), observe_only=True)
    tick = decide(_busy_and_idle(), _inp(said.memory, 1100.0))
    assert tick.plan is not None and tick.would is None and not tick.observe_only
    assert [r.pod for r in tick.plan.resize] == ["w1"] and tick.refs
    assert tick.memory.reported == ()  # switched on again later, it says all of it again


def test_a_launch_and_a_settle_are_said_too() -> None:
    full = snapshot([group(max_cpu=1)], [pod("w1", free_cpu=0)], [(res(1), 1)])  # no growth
    tick = decide(
        Observation(snapshot=full, gcs_address="h:6379", replicas={"g1": 1}),
        _inp(),
        observe_only=True,
    )
    assert set(_events(tick)) == {WOULD_SCALE_OUT}
    assert _events(tick)[WOULD_SCALE_OUT].startswith(f"{NOTHING_CHANGED}: would launch 1 × g1")
    drift = PodResize(
        cpu=3000, memory=2 * GIB, state=KubeletResizeState.IN_PROGRESS, raylet_only=True
    )
    out_of_step = snapshot([group()], [pod("w1", resize=drift)])
    memory = Memory(drift_since={"w1": 900.0})  # its Raylet has differed from it 100 s
    tick = decide(
        Observation(snapshot=out_of_step, gcs_address="h:6379"), _inp(memory), observe_only=True
    )
    assert set(_events(tick)) == {WOULD_SETTLE}
    assert _events(tick)[WOULD_SETTLE].startswith(
        f"{NOTHING_CHANGED}: would settle w1: Raylet out of step"
    )
    assert tick.stuck == () and tick.would is not None and len(tick.would.stuck) == 1
    # the drift clock is not restarted (nothing was tried): said once, not again
    again = decide(
        Observation(snapshot=out_of_step, gcs_address="h:6379"),
        _inp(tick.memory, 1100.0),
        observe_only=True,
    )
    assert again.would is not None and again.would.lines and again.would.events == ()


def test_observe_only_plans_beside_ray_s_own_autoscaler() -> None:
    """Standing by, raysize plans nothing (two autoscalers would undo each other's work);
    observing only, it writes nothing, so it plans beside Ray's, to compare the two."""
    for owner in ({"in_tree_autoscaling": True}, {"ray_autoscaler_pod": "head-0"}):
        obs = _busy_and_idle().model_copy(update=owner)
        assert decide(obs, _inp()).plan is None and decide(obs, _inp()).would is None
        tick = decide(obs, _inp(), observe_only=True)
        assert tick.plan is None and tick.would is not None
        assert set(_events(tick)) == {WOULD_RESIZE, WOULD_SCALE_IN}


def test_a_long_list_fits_one_event_and_says_how_many_more() -> None:
    p = Plan(
        terminate=tuple(
            TerminateAction(pod=f"pod-{i:03}", group="g1", reason="idle for 120s " + "x" * 40)
            for i in range(100)
        )
    )
    would, keys = would_do(p, ())
    (event,) = would.events
    assert len(event.message) <= MAX_EVENT_MESSAGE
    assert event.message.startswith(f"{NOTHING_CHANGED}: would remove pod-000")
    shown = event.message.count("would remove")
    assert event.message.endswith(f"… and {100 - shown} more (raysize status lists them)")
    assert len(would.lines) == 100 and len(keys) == 100
    # a single line longer than an Event holds is cut, and still says it changed nothing
    (long,) = would_do(
        Plan(terminate=(p.terminate[0].model_copy(update={"reason": "y" * 2000}),)), ()
    )[0].events
    assert len(long.message) <= MAX_EVENT_MESSAGE and long.message.startswith(NOTHING_CHANGED)
