"""When an unchanging cluster next needs a decision: the reconcile loop's wait ends then,
so an idle pod still shrinks on time though the safety tick is minutes long."""

from __future__ import annotations

import pytest

from raysize.workflows.deadlines import (
    GROW_WATCH_S,
    MARGIN_S,
    RAYLET_DRIFT_S,
    GrowWatch,
    drifting,
    next_decision_in,
    stuck_after_s,
    stuck_resizes,
)
from raysize.workflows.model import (
    KubeletResizeState,
    PlannerSettings,
    PodPhase,
    PodResize,
    ResizeAction,
)
from raysize.workflows.planner import JUST_GROWN_S, LANDING_S, PUBLICATION_WAIT_S, plan
from raysize.workflows.resources import GIB

from .kit import group, head_group, pod, res, snapshot
from .kit import head as kit_head

SETTINGS = PlannerSettings(idle_timeout_s=60, raylet_start_timeout_s=600)


def test_a_busy_cluster_has_no_deadline():
    snap = snapshot([group()], [pod("w1"), pod("w2")], settings=SETTINGS)
    assert next_decision_in(snap) is None


def test_the_first_idle_pod_to_expire_sets_the_deadline():
    snap = snapshot(
        [group()], [pod("w1", idle_s=10), pod("w2", idle_s=45), pod("w3")], settings=SETTINGS
    )
    assert next_decision_in(snap) == 15 + MARGIN_S
    # ... and at that moment the planner does act on it
    later = snapshot(
        [group()],
        [pod("w1", idle_s=10 + 15 + MARGIN_S), pod("w2", idle_s=45 + 15 + MARGIN_S), pod("w3")],
        settings=SETTINGS,
    )
    assert [t.pod for t in plan(later).terminate] == ["w2"]


def test_an_expired_idle_pod_the_plan_keeps_sets_no_deadline():
    """A pod kept by the group's minimum stays idle past its timeout: waking for it again
    and again would be the spin this module exists to avoid."""
    snap = snapshot([group(min_workers=1)], [pod("w1", idle_s=300)], settings=SETTINGS)
    assert not plan(snap).terminate
    assert next_decision_in(snap) is None


def test_a_failed_pod_shrinks_back_an_idle_timeout_after_its_failure():
    snap = snapshot(
        [group()],
        [pod("w1", cpu=3, idle_s=100, failed=True, failed_age_s=20)],
        settings=SETTINGS,
    )
    assert next_decision_in(snap) == 40 + MARGIN_S


def test_a_raylet_that_never_registered_is_due_at_the_start_timeout():
    snap = snapshot([group()], [pod("w1", raylet_id=None, running_s=590.0)], settings=SETTINGS)
    assert next_decision_in(snap) == 10 + MARGIN_S
    pending = snapshot([group()], [pod("w1", phase=PodPhase.PENDING)], settings=SETTINGS)
    assert next_decision_in(pending) is None  # a pod change wakes the loop instead
    # as the snapshot has it (no Raylet: PENDING), Kubernetes running it for 590 s
    silent = pod("w1", phase=PodPhase.PENDING, running_s=590.0)
    assert next_decision_in(snapshot([group()], [silent], settings=SETTINGS)) == 10 + MARGIN_S


def test_the_cluster_own_idle_timeout_counts():
    snap = snapshot(
        [group()],
        [pod("w1", idle_s=10)],
        settings=SETTINGS.model_copy(update={"idle_timeout_s": 30}),
    )
    assert next_decision_in(snap) == 20 + MARGIN_S


def stuck_pod(asked_s: float | None, state: KubeletResizeState = KubeletResizeState.DEFERRED):
    return pod("w1", resize=PodResize(cpu=4000, memory=2 * GIB, state=state, asked_s=asked_s))


def test_a_resize_nobody_works_on_is_taken_back_to_the_pods_actual_size():
    """Under API faults a pod stayed 600 s with spec 4 CPU and 1 CPU actuated, with no
    saga on it. Past what any saga can spend (4 × resize-timeout + 2 min), it is settled."""
    limit = stuck_after_s(60)
    assert limit == 360
    fresh = snapshot([group()], [stuck_pod(100)], settings=SETTINGS)
    assert stuck_resizes(fresh) == ()
    assert next_decision_in(fresh) == limit - 100 + MARGIN_S  # ... and looked at then
    (action,) = stuck_resizes(snapshot([group()], [stuck_pod(600)], settings=SETTINGS))
    assert (action.pod, action.cpu, action.from_cpu) == ("w1", 1000, 1000)
    assert action.reason.startswith(
        "stuck resize: Kubernetes asks 4 CPU/2Gi, the kubelet has 1 CPU/2Gi (deferred) 600s"
    )
    # a resize raysize did not ask for (no resizing-at) is someone else's: left alone
    assert stuck_resizes(snapshot([group()], [stuck_pod(None)], settings=SETTINGS)) == ()
    done = pod("w1", resize=PodResize(cpu=4000, memory=2 * GIB, state=KubeletResizeState.ERROR))
    assert stuck_resizes(snapshot([group()], [done], settings=SETTINGS)) == ()


def test_a_raylet_out_of_step_with_its_pod_is_brought_to_the_pods_size():
    """A Raylet killed mid-resize came back at its start-up size (KubeRay's `ray start`
    line keeps the template's CPUs): the pod had 3 CPU, its Raylet 1, for good. After
    RAYLET_DRIFT_S with no resize on it, a saga brings the Raylet to the pod's size; a
    fresh difference (a saga's own sync in progress) is left alone, and looked at then."""
    drift = PodResize(
        cpu=3000, memory=2 * GIB, state=KubeletResizeState.IN_PROGRESS, raylet_only=True
    )
    snap = snapshot([group()], [pod("w1", resize=drift)], settings=SETTINGS)
    assert drifting(snap) == ("w1",)
    assert stuck_resizes(snap, {"w1": 5.0}) == ()
    assert next_decision_in(snap, {"w1": 5.0}) == RAYLET_DRIFT_S - 5 + MARGIN_S
    (action,) = stuck_resizes(snap, {"w1": RAYLET_DRIFT_S + 1})
    assert (action.pod, action.from_cpu, action.cpu) == ("w1", 3000, 3000)
    assert action.reason.startswith(
        "Raylet out of step: the pod has 3 CPU/2Gi, its Raylet reports 1 CPU/2Gi for 31s"
    )


def test_the_raylet_of_a_pod_launched_at_size_is_brought_to_it_at_once():
    """A pod raysize launched at size (issue #44: the admission policy made it 3 CPU, its
    template says 1) was never resized, so no saga's own Raylet step can be on its way: its
    Raylet, started at KubeRay's `ray start` size, is brought to the pod's size in the
    first tick that sees it, not RAYLET_DRIFT_S later (its first task waits until then)."""
    born = PodResize(
        cpu=3000,
        memory=2 * GIB,
        state=KubeletResizeState.IN_PROGRESS,
        raylet_only=True,
        launched=True,
    )
    snap = snapshot([group()], [pod("w1", resize=born)], settings=SETTINGS)
    (action,) = stuck_resizes(snap, {"w1": 0.0})
    assert (action.pod, action.from_cpu, action.cpu) == ("w1", 3000, 3000)
    assert action.reason == (
        "launched at size: the pod started at 3 CPU/2Gi, its Raylet at 1 CPU/2Gi (KubeRay's "
        "ray start line) → Raylet to 3 CPU/2Gi"
    )
    assert next_decision_in(snap, {"w1": 0.0}) == 2 * MARGIN_S
    # a pod raysize resized before waits, as a Raylet restarted at its start-up size does
    grown = born.model_copy(update={"launched": False})
    regrown = snapshot([group()], [pod("w1", resize=grown)], settings=SETTINGS)
    assert stuck_resizes(regrown, {"w1": 0.0}) == ()


def test_a_group_outside_ray_io_ippr_is_never_resized_nor_settled():
    """ray.io/ippr lists the groups raysize may resize; the head is one of them only when
    named there. Seen on the real control plane: the head (1 CPU pod, `num-cpus: "0"`,
    not in ray.io/ippr) was "settled" to a 1-CPU Raylet after RAYLET_DRIFT_S, and tasks
    then ran on it. Whatever a pod outside the annotation shows (its Raylet differs from
    the pod, or Kubernetes holds a resize someone asked for long ago), raysize leaves it
    alone and sets no deadline for it."""
    drift = PodResize(
        cpu=1000, memory=2 * GIB, state=KubeletResizeState.IN_PROGRESS, raylet_only=True
    )
    held = PodResize(cpu=4000, memory=2 * GIB, state=KubeletResizeState.DEFERRED, asked_s=3600)
    fixed = group("fixed", max_cpu=None)
    head = kit_head().model_copy(update={"resize": drift})
    pods = [head, pod("f1", "fixed", resize=drift), pod("f2", "fixed", resize=held)]
    snap = snapshot([group(), fixed], [], settings=SETTINGS).model_copy(
        update={"pods": tuple(pods)}
    )
    long_ago = {"head": 10 * RAYLET_DRIFT_S, "f1": 10 * RAYLET_DRIFT_S}
    assert drifting(snap) == ()
    assert stuck_resizes(snap, long_ago) == ()
    assert next_decision_in(snap, long_ago) is None
    # named in ray.io/ippr, the head is raysize's to settle like any group
    in_ippr = snap.model_copy(
        update={
            "groups": {
                **snap.groups,
                "headgroup": head_group().model_copy(update={"ippr": group().ippr}),
            }
        }
    )
    assert drifting(in_ippr) == ("head",)
    assert [r.pod for r in stuck_resizes(in_ippr, long_ago)] == ["head"]


def test_launches_held_for_a_landing_grow_are_due_when_it_stops_landing():
    """A grow the kubelet is carrying out holds back launches (planner.landing_grows);
    should it never land, the plan must be made again when it stops counting as landing,
    though nothing changes. With nothing pending, nothing waits on it."""
    grow = PodResize(cpu=4000, memory=2 * GIB, state=KubeletResizeState.IN_PROGRESS, asked_s=3)
    busy = snapshot([group()], [pod("w1", resize=grow)], [(res(2), 3)])
    assert plan(busy).launch == ()
    assert next_decision_in(busy) == pytest.approx(LANDING_S - 3 + MARGIN_S)
    assert plan(busy.model_copy(update={"pods": (pod("w1", cpu=4, mem_gib=2),)})).launch
    quiet = snapshot([group()], [pod("w1", resize=grow)])
    assert next_decision_in(quiet) == pytest.approx(stuck_after_s(60) - 3 + MARGIN_S)


def grow(name: str, cpu: float = 4, *, from_cpu: float = 1) -> ResizeAction:
    return ResizeAction(
        pod=name,
        group="g1",
        cpu=int(cpu * 1000),
        memory=2 * GIB,
        from_cpu=int(from_cpu * 1000),
        from_memory=2 * GIB,
        reason="test",
    )


def test_a_grow_that_landed_holds_launches_for_a_moment_then_plans_again():
    """The reconcile loop learns a grow landed when its saga is over and the pod is
    bigger; for JUST_GROWN_S it names it to the planner (no launch: Ray may still report
    the work it took) and plans again when that ends, though nothing changes."""
    watch = GrowWatch()
    watch.started(grow("w1"), now=100.0)
    watch.started(grow("w2", cpu=1, from_cpu=2), now=100.0)  # a shrink: not watched
    inflight = PodResize(cpu=4000, memory=2 * GIB, state=KubeletResizeState.IN_PROGRESS)
    before = snapshot([group()], [pod("w1", resize=inflight), pod("w2", cpu=2)])
    assert watch.observe(before, ["w1"], now=101.0) == []  # still growing
    # its saga has not written the pod yet: not landed either
    assert watch.observe(snapshot([group()], [pod("w1")]), [], now=101.5) == []
    landed = snapshot([group()], [pod("w1", cpu=4, free_cpu=0), pod("w2", cpu=2)])
    assert watch.observe(landed, [], now=102.0) == ["w1"]
    # it looks again one publication period (and a margin) later ...
    assert watch.due_in(102.0) == pytest.approx(PUBLICATION_WAIT_S)
    # ... and, no publication known (a GCS whose timetable is not learned yet), the hold
    # goes on to JUST_GROWN_S
    assert watch.observe(landed, [], now=102.0 + PUBLICATION_WAIT_S) == ["w1"]
    assert watch.due_in(102.0 + PUBLICATION_WAIT_S) == pytest.approx(
        JUST_GROWN_S - PUBLICATION_WAIT_S + MARGIN_S
    )
    assert watch.observe(landed, [], now=102.0 + JUST_GROWN_S - 1) == ["w1"]
    assert watch.due_in(102.0 + JUST_GROWN_S - 1) == pytest.approx(1 + MARGIN_S)
    assert watch.observe(landed, [], now=102.0 + JUST_GROWN_S) == []  # over
    assert watch.due_in(102.0 + JUST_GROWN_S) is None


def test_the_hold_ends_early_once_the_grown_pod_is_resized_again():
    """An idle pod shrinking back right after its grow (a short idle timeout): its work
    is over and Ray knows it, so new demand does not wait for the hold's end."""
    for shrinking in ("saga", "resize", "smaller"):
        watch = GrowWatch()
        watch.started(grow("w1"), now=0.0)
        assert watch.observe(snapshot([group()], [pod("w1", cpu=4)]), [], now=1.0) == ["w1"]
        shrink = PodResize(cpu=1000, memory=2 * GIB, state=KubeletResizeState.IN_PROGRESS)
        now = {
            "saga": ([pod("w1", cpu=4)], ["w1"]),
            "resize": ([pod("w1", cpu=4, resize=shrink)], []),
            "smaller": ([pod("w1", cpu=1)], []),
        }[shrinking]
        assert watch.observe(snapshot([group()], now[0]), now[1], now=2.0) == [], shrinking
        assert watch.due_in(2.0) is None


def test_a_grow_that_failed_or_never_began_holds_nothing():
    watch = GrowWatch()
    watch.started(grow("w1"), now=0.0)
    watch.started(grow("w2"), now=0.0)
    watch.started(grow("w3"), now=0.0)
    # w1 rolled back (no bigger, a failure on record); w3's pod is gone
    rolled_back = snapshot([group()], [pod("w1", failed=True), pod("w2")])
    assert watch.observe(rolled_back, [], now=5.0) == []
    assert set(watch.growing) == {"w2"}  # w1's and w3's are forgotten
    assert watch.landed == {}
    # w2's saga never wrote the pod: forgotten after GROW_WATCH_S
    assert watch.observe(rolled_back, [], now=GROW_WATCH_S + 1) == []
    assert watch.growing == {}
    # a pod whose grow landed and went away in the hold is not named
    watch.started(grow("w4"), now=0.0)
    assert watch.observe(snapshot([group()], [pod("w4", cpu=4)]), [], now=1.0) == ["w4"]
    assert watch.observe(snapshot([group()], []), [], now=2.0) == []
