"""`bench.fleet_bench --set NAME=VALUE`: settings for its workers, refused by name when wrong."""

from __future__ import annotations

import argparse

import pytest

from bench.fleet_bench import worker_setting


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
