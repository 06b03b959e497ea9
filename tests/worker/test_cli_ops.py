"""Operator commands: bad input gets one clear line and a non-zero exit."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from worker.cli import app

runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["status", "demo"],
            "'demo' is not <namespace>/<raycluster>; e.g. default/raycluster-demo",
        ),
        (["pause", "a/b/c"], "'a/b/c' is not <namespace>/<raycluster>"),
        (["cancel", "/c", "--pod", "p"], "'/c' is not <namespace>/<raycluster>"),
        (
            ["cancel", "default/demo"],
            "cancel needs the pod: raysize cancel <namespace>/<raycluster> --pod <pod>",
        ),
        (["start", "ns/"], "'ns/' is not <namespace>/<raycluster>"),
    ],
)
def test_bad_references_are_refused(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert result.stderr.strip().startswith(f"error: {message}")
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_setting_names_the_variable() -> None:
    result = runner.invoke(app, ["status", "ns/demo"], env={"RAYSIZE_CPU_STEP": "4 cores"})
    assert result.exit_code == 1
    assert result.stderr.startswith("error: RAYSIZE_CPU_STEP: ")
    assert "'4 cores' is not a quantity" in result.stderr


def test_unreachable_temporal_is_one_clear_line() -> None:
    result = runner.invoke(
        app, ["status", "ns/demo"], env={"RAYSIZE_TEMPORAL_ADDRESS": "127.0.0.1:9"}
    )
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: cannot reach Temporal at 127.0.0.1:9")
    assert "RAYSIZE_TEMPORAL_ADDRESS" in lines[0]


def test_a_bad_log_level_is_refused_by_flag_and_by_setting() -> None:
    flag = runner.invoke(app, ["worker", "--log-level", "LOUD"])
    assert flag.exit_code != 0
    assert "--log-level 'LOUD': expected one of DEBUG, INFO, WARNING, ERROR" in flag.stderr
    env = runner.invoke(app, ["worker"], env={"RAYSIZE_LOG_LEVEL": "loud"})
    assert env.exit_code != 0
    assert env.stderr.startswith("error: RAYSIZE_LOG_LEVEL: ")
    assert "'loud': expected one of DEBUG, INFO, WARNING, ERROR" in env.stderr
