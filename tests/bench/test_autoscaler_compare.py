"""bench.autoscaler_compare's accounting and report (the runs themselves:
tests/e2e/test_autoscaler_compare.py)."""

from __future__ import annotations

import pytest

from bench.autoscaler_compare import Result, account, compare_cluster, parse_args, row, summary


def test_what_the_pods_did_from_the_first_submission_on() -> None:
    events = [
        (1.0, "ADDED", "w1", 1.0),  # before t0: the cluster as it started
        (2.0, "MODIFIED", "w1", 1.0),  # a status write: no resize
        (5.0, "MODIFIED", "w1", 4.0),  # grown 1 → 4: +3
        (6.0, "MODIFIED", "w1", 4.0),
        (7.0, "ADDED", "w2", 1.0),  # launched: +1
        (8.0, "MODIFIED", "w2", 2.0),  # grown: +1
        (9.0, "MODIFIED", "w1", 1.0),  # shrunk: a resize, nothing added
        (10.0, "DELETED", "w2", 2.0),
    ]
    assert account(events, t0=3.0) == (3, 1, 5.0, 6.0)  # peak: w1 at 4 beside w2 at 2
    # a grow before the first submission is the cluster's, not the workload's
    assert account(events, t0=6.5) == (2, 1, 2.0, 6.0)
    # shrunk and grown again: added twice, bought once
    again = [(1.0, "ADDED", "w1", 1.0), (4.0, "MODIFIED", "w1", 4.0)]
    again += [(5.0, "MODIFIED", "w1", 1.0), (6.0, "MODIFIED", "w1", 4.0)]
    assert account(again, t0=3.0) == (3, 0, 6.0, 4.0)


def test_both_controllers_get_the_same_cluster_but_the_flag() -> None:
    ray, ours = compare_cluster("a", "three", "ray"), compare_cluster("a", "three", "raysize")
    assert ray["spec"]["enableInTreeAutoscaling"] is True
    assert ray["spec"]["autoscalerOptions"] == {"idleTimeoutSeconds": 10, "version": "v2"}
    assert "enableInTreeAutoscaling" not in ours["spec"]
    assert ours["spec"]["autoscalerOptions"] == {"idleTimeoutSeconds": 10}
    for rc in (ray, ours):
        group = rc["spec"]["workerGroupSpecs"][0]
        assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (3, 3, 4)
    assert ray["metadata"]["annotations"] == ours["metadata"]["annotations"]


def result(controller: str, done: float, **kw: object) -> Result:
    return Result("embedded", "pg", controller, 1, first_start_s=1.0, done_s=done, **kw)  # type: ignore[arg-type]


def test_the_verdict_names_each_workload_ray_finished_first() -> None:
    lines, behind = summary(
        [result("ray", 10.0, group_ready_s=0.5), result("raysize", 8.0, group_ready_s=0.7)]
    )
    assert behind == []
    assert lines[0].endswith("raysize 1.25x sooner")
    assert "group ready 0.5 s" in lines[0] and "group ready 0.7 s" in lines[0]
    lines, behind = summary([result("ray", 10.0), result("raysize", 12.5)])
    assert behind == ["embedded/pg"] and lines[0].endswith("raysize 1.25x LATER")
    # a failed task (or run) is never a win
    lines, behind = summary([result("ray", 10.0), result("raysize", 5.0, failed=1)])
    assert behind == ["embedded/pg (a run failed)"]
    failed = Result("embedded", "pg", "ray", 1, error="driver exit 3: workers did not join")
    assert row(failed).endswith("ERROR driver exit 3: workers did not join")


def test_bad_arguments_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--rounds", "0"])
    assert "--rounds: at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--worlds", "embedded,moon"])
    assert "--worlds: moon; choose from embedded, real" in capsys.readouterr().err
    assert parse_args(["--workloads", "pg, one"]).workloads == ["pg", "one"]


def test_tight_nodes_prefer_the_filled_node_and_deferred_grows_are_counted_once() -> None:
    from types import SimpleNamespace as O

    from bench.autoscaler_compare import WORKLOADS, PodEvents

    rc = compare_cluster("a", "tight", "raysize")
    affinity = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["affinity"]
    preferred = affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred[0]["preference"]["matchExpressions"][0]["values"] == ["node-a"]
    assert WORKLOADS["tight"].fillers == (("node-a", 3000), ("node-b", 2000))

    def pod(reason: str | None) -> O:
        conditions = [O(type="PodResizePending", reason=reason)] if reason else []
        res = O(requests={"cpu": "1"}, limits=None)
        return O(
            metadata=O(name="w1", labels={"ray.io/node-type": "worker"}),
            spec=O(containers=[O(resources=res)]),
            status=O(conditions=conditions),
        )

    events = PodEvents()
    for reason in (None, "Deferred", "Deferred", None, "Infeasible"):
        events.record("MODIFIED", pod(reason))
    assert [name for _, name in events.deferred] == ["w1", "w1"]  # two times it began


def test_the_new_node_workload_reports_karpenters_nodes_and_runs_in_the_real_world_only() -> None:
    from bench.autoscaler_compare import WORKLOADS

    assert WORKLOADS["newnode"].worlds == ("real",) and WORKLOADS["newnode"].karpenter
    r = Result("real", "newnode", "raysize", 1, first_start_s=20.0, done_s=22.0, new_nodes=1)
    assert row(r).split()[-1] == "1"
    r2 = Result("real", "newnode", "ray", 1, first_start_s=40.0, done_s=45.0, new_nodes=2)
    (line,), behind = summary([r, r2])
    assert "new nodes 1" in line and "new nodes 2" in line and behind == []
    # the other workloads say nothing of nodes
    (plain,), _ = summary([Result("real", "one", "raysize", 1, done_s=3.0)])
    assert "new nodes" not in plain


def test_a_run_that_did_not_end_says_what_its_controller_did_meanwhile() -> None:
    r = Result("real", "newnode", "ray", 1, error="the workload did not end in 300 s")
    assert row(r).endswith("ERROR the workload did not end in 300 s")
    r.resizes, r.launched, r.cpu_added, r.deferred, r.new_nodes = 3, 2, 8.0, 3, 1
    assert row(r).endswith(
        "(meanwhile: 3 resizes, 2 launched, CPU added 8, 3 deferred, 1 new nodes)"
    )
