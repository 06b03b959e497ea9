"""`bench.fleet_bench`: `--set NAME=VALUE` and `--server-config KEY=JSON` refused when wrong, and
its count of resizes run twice."""

from __future__ import annotations

import argparse

import pytest

from bench.fleet_bench import ResizeRun, resize_runs, server_config_value, worker_setting


def test_a_worker_setting_is_taken_by_its_name_or_its_variable() -> None:
    assert worker_setting("max_cached_workflows=500") == ("max_cached_workflows", "500")
    assert worker_setting("RAYSIZE_KUBE_QPS=50") == ("kube_qps", "50")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("max_cached_workflows", "give NAME=VALUE"),
        ("=5", "give NAME=VALUE"),
        ("max_cached_workflows=", "give NAME=VALUE"),
        ("max_cached_workflow=500", "'max_cached_workflow' is no worker setting"),
    ],
)
def test_a_bad_setting_is_refused_by_name(text: str, says: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        worker_setting(text)


def test_a_server_config_value_is_passed_as_given() -> None:
    """`--server-config KEY=JSON`: a dynamic config value of the dev server."""
    given = "system.enableActivityEagerExecution=true"
    assert server_config_value(given) == given
    assert server_config_value('limit.name="x"') == 'limit.name="x"'


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("system.enableActivityEagerExecution", "not KEY=JSON.*no '='"),
        ("=true", "not KEY=JSON.*no '='"),
        ("limit.name=x", "not KEY=JSON.*a string value needs quotes"),
    ],
)
def test_a_bad_server_config_value_is_refused_before_the_server_starts(
    text: str, says: str
) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        server_config_value(text)


def test_a_run_listed_twice_while_it_closes_is_one_run() -> None:
    """#43 item 3: the burst's "run twice" pairs were one run each, listed as running on
    one page of the visibility list and as closed on the next (the same run ID, started
    the same instant; the loop's history had one start). Two runs of the same resize are
    still counted."""

    def run(run_id: str, status: str, was: str = "1 CPU") -> ResizeRun:
        return ResizeRun(
            "resize/default/p", run_id, was, "4 CPU", "17:16:34", status, "?", ("", "")
        )

    runs, status = resize_runs(
        [run("r1", "running"), run("r1", "completed"), run("r2", "running", "2 CPU")]
    )
    assert [len(v) for v in runs.values()] == [1, 1]
    assert runs[("resize/default/p", "1 CPU", "4 CPU")][0].status == "completed"
    assert status == {"COMPLETED": 1, "RUNNING": 1}
    runs, _ = resize_runs([run("r1", "completed"), run("r3", "running")])
    assert [len(v) for v in runs.values()] == [2]  # two runs of the same resize: twice
