"""Node-aware planning (issue #44 item 3): a pod grows only as far as its node has room
(`ClusterSnapshot.nodes`: allocatable minus what the scheduler charges its pods), pods on
one node share that room, work goes to pods whose nodes have room before a pod is
launched, and the decision says which node had how much."""

from __future__ import annotations

from raysize.workflows.model import (
    Gang,
    GangStrategy,
    NodeRoom,
    PlannerSettings,
    ResizePolicy,
)
from raysize.workflows.planner import plan
from raysize.workflows.resources import GIB

from .kit import cores, group, pod, res, snapshot


def room(cpu: float, mem_gib: float = 64) -> NodeRoom:
    return NodeRoom(cpu=cores(cpu), memory=int(mem_gib * GIB))


def sizes(p) -> dict[str, tuple[float, float]]:
    return {r.pod: (r.cpu / 1000, r.memory / GIB) for r in p.resize}


def test_a_pod_grows_only_as_far_as_its_node_has_room() -> None:
    # {CPU: 3} waits; the pod (1 CPU, max 4) is on a node with 1 CPU left: growing it to
    # 4 would be deferred by the kubelet (or refused at admission): a pod is launched
    snap = snapshot(
        [group()], [pod("w1", idle_s=5, node="n1")], [(res(3), 1)], nodes={"n1": room(1)}
    )
    p = plan(snap)
    assert sizes(p) == {}
    assert p.launch_by_group == {"g1": 1}
    # without the node's room (not read) it grows, as before
    blind = plan(snapshot([group()], [pod("w1", idle_s=5, node="n1")], [(res(3), 1)]))
    assert sizes(blind) == {"w1": (3, 2)} and blind.launch == ()


def test_a_grow_that_fits_its_node_says_how_much_room_the_node_had() -> None:
    snap = snapshot(
        [group()], [pod("w1", idle_s=5, node="n1")], [(res(2), 1)], nodes={"n1": room(1, 4)}
    )
    p = plan(snap)
    assert sizes(p) == {"w1": (2, 2)}
    assert "(node n1 had 1 CPU/4Gi free)" in p.resize[0].reason


def test_pods_on_one_node_share_its_room() -> None:
    # two idle 1-CPU pods on n1 with 2 CPU left; four {CPU: 2} tasks: each pod could grow
    # to 2 (1 more each) — together 2 CPU, exactly the node's room; the other two tasks
    # get new pods, not a third core on n1
    pods = [pod("w1", idle_s=5, node="n1"), pod("w2", idle_s=5, node="n1")]
    p = plan(snapshot([group()], pods, [(res(2), 4)], nodes={"n1": room(2)}))
    grown = sizes(p)
    assert sum(cpu - 1 for cpu, _ in grown.values()) <= 2, grown
    assert grown == {"w1": (2, 2), "w2": (2, 2)}
    assert p.launch_by_group == {"g1": 1}  # one new pod (at its 4 CPU max) holds both


def test_rounding_up_a_grow_stops_at_its_nodes_room() -> None:
    # the max policy grows a pod to its group's maximum: only up to its node's room
    snap = snapshot(
        [group()],
        [pod("w1", idle_s=5, node="n1")],
        [(res(2), 1)],
        nodes={"n1": room(2, 5)},
        settings=PlannerSettings(resize_policy=ResizePolicy.MAX),
    )
    assert sizes(plan(snap)) == {"w1": (3, 7)}


def test_work_goes_to_the_pod_whose_node_has_room() -> None:
    # w1's node is full, w2's has room: the grow is w2's, nothing is launched
    pods = [pod("w1", idle_s=5, node="full"), pod("w2", idle_s=5, node="roomy")]
    p = plan(snapshot([group()], pods, [(res(3), 1)], nodes={"full": room(0), "roomy": room(6)}))
    assert sizes(p) == {"w2": (3, 2)} and p.launch == ()


def test_a_node_charged_past_its_allocatable_has_no_room() -> None:
    pods = [pod("w1", idle_s=5, node="n1")]
    p = plan(snapshot([group()], pods, [(res(2), 1)], nodes={"n1": room(-1, -1)}))
    assert sizes(p) == {} and p.launch_by_group == {"g1": 1}


def test_a_placement_group_that_does_not_fit_gives_its_nodes_room_back() -> None:
    # a busy 4-CPU pod on n1 (3 CPU left). A PACK gang of two {CPU: 2} bundles tries
    # growth: the first bundle grows w1 (n1: 1 CPU left), the second fits nowhere: the
    # attempt is undone, n1's room with it. The {CPU: 3} task after it then grows w1.
    snap = snapshot(
        [group(max_cpu=8, max_mem_gib=16)],
        [pod("w1", cpu=4, free_cpu=0, node="n1")],
        [(res(3), 1)],
        nodes={"n1": room(3)},
        gangs=(Gang(bundles=(res(2), res(2)), strategy=GangStrategy.PACK),),
    )
    p = plan(snap)
    assert [(r.pod, r.cpu) for r in p.resize] == [("w1", cores(7))], [r.reason for r in p.resize]
    assert "1 × {CPU: 3} pending" in p.resize[0].reason


def launched(p) -> dict[str, tuple[float, float, int]]:
    return {a.group: (a.cpu / 1000, a.memory / GIB, a.count) for a in p.launch}


def test_a_pod_is_launched_at_the_size_of_the_work_it_is_for() -> None:
    # {CPU: 3} waits and w1's node has no room: the new pod starts at 3 CPU (the task's
    # memory rounded up to the 1Gi step), so the scheduler places it where 3 CPU fit and a
    # node autoscaler sees 3 CPU, not the template's 1 CPU that would fit anywhere
    snap = snapshot(
        [group()], [pod("w1", idle_s=5, node="n1")], [(res(3), 1)], nodes={"n1": room(0.5)}
    )
    p = plan(snap)
    assert launched(p) == {"g1": (3, 2, 1)}
    assert p.launch[0].reason.endswith(", at 3 CPU/2Gi"), p.launch[0].reason


def test_pods_launched_together_start_at_the_largest_work_of_their_group() -> None:
    # two {CPU: 3} and one {CPU: 1}: at most 4 CPU a pod (its IPPR maximum); the group's
    # new pods start at the size the largest of them needs
    p = plan(snapshot([group()], [], [(res(3), 2), (res(1), 1)]))
    (a,) = p.launch
    assert a.count == 2 and a.cpu == cores(4), a
    assert a.cpu <= cores(4)


def test_a_launch_the_template_covers_says_no_size() -> None:
    # the template's 1 CPU/1Gi holds the work: the pod starts as its template says
    p = plan(snapshot([group()], [], [(res(1, 1), 1)]))
    assert launched(p) == {"g1": (0, 0, 1)}
    assert ", at " not in p.launch[0].reason
