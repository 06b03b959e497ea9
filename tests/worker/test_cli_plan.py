"""`raysize plan` as an operator uses it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench.plan_bench import generate
from worker.cli import app

GIB = 1024**3
SEED_CASE_2 = {
    "version": 1,
    "name": "seed-case-2",
    "max_workers": 10,
    "idle_timeout_s": 60,
    "groups": {
        "g1": {
            "resources": {"CPU": 1, "memory": 2 * GIB},
            "min_workers": 0,
            "max_workers": 10,
            "labels": {},
            "ippr": {"max_cpu": 4, "max_memory": 8 * GIB, "resize_timeout_s": 60},
        }
    },
    "pods": [
        {
            "name": "c-g1-aaaaa",
            "group": "g1",
            "phase": "running",
            "raylet_id": "ab" * 28,
            "total": {"CPU": 1, "memory": 2 * GIB},
            "available": {"CPU": 1, "memory": 2 * GIB},
            "idle_s": 3,
            "resize": None,
        }
    ],
    "demands": [
        {"shape": {"CPU": 2}, "count": 1, "label_selector": {}},
        {"shape": {"CPU": 4}, "count": 1, "label_selector": {}},
    ],
    "gangs": [],
    "constraints": [],
}

runner = CliRunner()


def write(tmp_path: Path, doc: object) -> Path:
    f = tmp_path / "scenario.json"
    f.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return f


def test_plan_prints_the_scenario_plan_json(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", "--scenario", str(write(tmp_path, SEED_CASE_2))])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out == {
        "launch": {"g1": 1},
        "resize": [{"pod": "c-g1-aaaaa", "cpu": 4.0, "memory": 2 * GIB}],
        "terminate": [],
        "infeasible": {"demands": 0, "gangs": 0, "constraints": 0},
    }


def test_max_policy_is_rays_behaviour(tmp_path: Path) -> None:
    f = write(tmp_path, SEED_CASE_2)
    result = runner.invoke(app, ["plan", "-s", str(f), "--resize-policy", "max"])
    assert json.loads(result.stdout)["resize"] == [
        {"pod": "c-g1-aaaaa", "cpu": 4.0, "memory": 8 * GIB}
    ]


def test_explain_prints_every_reason(tmp_path: Path) -> None:
    f = write(tmp_path, SEED_CASE_2)
    result = runner.invoke(app, ["plan", "-s", str(f), "--explain"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "1 × {CPU: 4} pending → grow 1 CPU/2Gi → 4 CPU/2Gi" in result.stdout
    assert "1 for {CPU: 2} pending" in result.stdout


def test_timing_prints_the_median_on_stderr(tmp_path: Path) -> None:
    f = write(tmp_path, generate(50, 500))
    result = runner.invoke(app, ["plan", "-s", str(f), "--repeat", "3", "--timing"])
    assert result.exit_code == 0
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("plan_seconds=")]
    assert len(lines) == 1
    assert float(lines[0].split("=")[1]) > 0
    assert "launch" in json.loads(result.stdout)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            "{not json",
            "is not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2",
        ),
        ({**SEED_CASE_2, "version": 2}, "version: 2 is not supported; this reads version 1"),
        ({**SEED_CASE_2, "groups": []}, "groups: expected an object, got a list"),
        (
            {**SEED_CASE_2, "pods": [{**SEED_CASE_2["pods"][0], "group": "nope"}]},
            "pods[0].group: 'nope' is not in groups (g1)",
        ),
        (
            {**SEED_CASE_2, "pods": [{**SEED_CASE_2["pods"][0], "total": {"CPU": "4 cores"}}]},
            "pods[0].total.CPU: '4 cores' is not a number",
        ),
        (
            {**SEED_CASE_2, "demands": [{"shape": {"CPU": -1}, "count": 1}]},
            "demands[0].shape.CPU: -1 is negative",
        ),
        (
            {**SEED_CASE_2, "demands": [{"shape": {"CPU": 1}, "count": 1.5}]},
            "demands[0].count: expected a whole number, got 1.5",
        ),
        (
            {**SEED_CASE_2, "gangs": [{"bundles": [{"CPU": 1}], "strategy": "TIGHT"}]},
            "gangs[0].strategy: 'TIGHT' is not one of PACK, SPREAD, STRICT_PACK, STRICT_SPREAD",
        ),
        (
            {**SEED_CASE_2, "pods": [{**SEED_CASE_2["pods"][0], "resize": {"state": "stuck"}}]},
            "pods[0].resize.state: 'stuck' is not one of in_progress, deferred, infeasible, error, timed_out",
        ),
        (
            {**SEED_CASE_2, "pods": [SEED_CASE_2["pods"][0], SEED_CASE_2["pods"][0]]},
            "pods[1].name: 'c-g1-aaaaa' appears twice",
        ),
    ],
)
def test_bad_scenarios_get_a_precise_message_and_exit_2(
    tmp_path: Path, doc: object, message: str
) -> None:
    result = runner.invoke(app, ["plan", "--scenario", str(write(tmp_path, doc))])
    assert result.exit_code == 2
    assert message in result.stderr.replace("\n", "")
    assert result.stdout == ""


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", "--scenario", str(tmp_path / "nope.json")])
    assert result.exit_code == 2
    assert "cannot read" in result.stderr and "No such file or directory" in result.stderr
