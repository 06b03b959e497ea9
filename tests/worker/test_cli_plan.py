"""`raysize plan` as an operator uses it."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bench.plan_bench import generate
from raysize.worker.cli import app

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


def test_explain_full_prints_every_reason_and_where_each_unit_goes(tmp_path: Path) -> None:
    f = write(tmp_path, SEED_CASE_2)
    result = runner.invoke(app, ["plan", "-s", str(f), "--explain=full"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "1 × {CPU: 4} pending → grow 1 CPU/2Gi → 4 CPU/2Gi" in result.stdout
    assert "1 for {CPU: 2} pending" in result.stdout
    assert "where each unit goes" in result.stdout
    assert "c-g1-aaaaa" in result.stdout and "1 × {CPU: 4} pending" in result.stdout


def test_explain_summary_says_what_waits_what_the_plan_does_and_what_stays(
    tmp_path: Path,
) -> None:
    f = write(tmp_path, SEED_CASE_2)
    out = runner.invoke(app, ["plan", "-s", str(f), "--explain"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    text = out.stdout
    assert text.index("Pending") < text.index("The plan") < text.index("Left waiting")
    assert "2 task/actor unit(s) in 2 shape(s): 1 × {CPU: 2}, 1 × {CPU: 4}" in text
    assert "launches 1 pod(s) (g1 1)" in text
    assert "grows 1 pod(s) in place (+3 CPU)" in text
    assert "Left waiting\n  nothing" in text
    assert "--explain=full" in text


def test_explain_summary_of_a_200_pod_scenario_fits_a_screen(tmp_path: Path) -> None:
    f = write(tmp_path, generate(200, 2_000))
    out = runner.invoke(app, ["plan", "-s", str(f), "--explain"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert len(lines) <= 25, out.stdout
    assert lines[0].startswith("raysize plan for bench-200-2000: 200 worker pod(s)")
    assert any(ln.startswith("  2,000 task/actor unit(s) in 16 shape(s)") for ln in lines)
    # what stays says why
    assert any(
        "{CPU: 1, GPU: 1}: only gpu can hold it, and gpu is at max_workers=20" in ln for ln in lines
    ), out.stdout
    full = runner.invoke(app, ["plan", "-s", str(f), "--explain", "full"])
    assert len(full.stdout.splitlines()) > 10 * len(lines)


def test_tasks_inside_a_placement_group_are_not_called_unplaceable(tmp_path: Path) -> None:
    doc = scenario(
        demands=[
            {"shape": {"CPU_group_0_6f1b4a2de0c3417a9b2c8d7e5f60718293a4": 1}, "count": 2},
            {"shape": {"bundle_group_6f1b4a2de0c3417a9b2c8d7e5f60718293a4": 0.001}},
        ]
    )
    f = write(tmp_path, doc)
    out = json.loads(runner.invoke(app, ["plan", "-s", str(f)]).stdout)
    assert out["infeasible"] == {"demands": 0, "gangs": 0, "constraints": 0}
    text = runner.invoke(app, ["plan", "-s", str(f), "--explain"], env={"COLUMNS": "200"}).stdout
    assert "3 unit(s) wait inside their placement group" in text
    assert "Left waiting\n  nothing" in text
    full = runner.invoke(app, ["plan", "-s", str(f), "--explain=full"], env={"COLUMNS": "200"})
    assert "cannot place" not in full.stdout


def test_explain_with_an_unknown_mode_names_the_choices(tmp_path: Path) -> None:
    f = write(tmp_path, SEED_CASE_2)
    out = runner.invoke(app, ["plan", "-s", str(f), "--explain=short"])
    assert out.exit_code == 2
    assert "--explain=short: expected --explain (a summary) or --explain=full" in out.stderr


ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "docs" / "demo.md"


def test_the_readme_plan_example_runs_on_the_shipped_scenario(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    commands = [
        ln.strip().strip("`").strip()
        for ln in README.read_text().splitlines()
        if ln.strip().strip("`").startswith("raysize plan ")
    ]
    assert commands, "docs/demo.md has no `raysize plan` example"
    monkeypatch.chdir(ROOT)
    for command in commands:
        args = command.split()[1:]
        assert "bench/examples/small.json" in args
        out = runner.invoke(app, args, env={"COLUMNS": "200"})
        assert out.exit_code == 0, (command, out.output)
        assert "The plan" in out.stdout or "launch" in out.stdout


def test_timing_prints_the_median_on_stderr(tmp_path: Path) -> None:
    f = write(tmp_path, generate(50, 500))
    result = runner.invoke(app, ["plan", "-s", str(f), "--repeat", "3", "--timing"])
    assert result.exit_code == 0
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("plan_seconds=")]
    assert len(lines) == 1
    assert float(lines[0].split("=")[1]) > 0
    assert "launch" in json.loads(result.stdout)


def scenario(**changes: Any) -> dict[str, Any]:
    """SEED_CASE_2 with top-level keys changed (`...` removes a key)."""
    doc = copy.deepcopy(SEED_CASE_2)
    doc.update(changes)
    return {k: v for k, v in doc.items() if v is not ...}


def with_pod(**changes: Any) -> dict[str, Any]:
    """A copy of SEED_CASE_2's pod with these keys changed (`...` removes a key)."""
    p = {**SEED_CASE_2["pods"][0], **changes}
    return {k: v for k, v in p.items() if v is not ...}


def with_group(**changes: Any) -> dict[str, Any]:
    """SEED_CASE_2's groups, g1 with these keys changed (`...` removes a key)."""
    g = {**SEED_CASE_2["groups"]["g1"], **changes}
    return {"g1": {k: v for k, v in g.items() if v is not ...}}


def ippr(**changes: Any) -> dict[str, Any]:
    limits = {"max_cpu": 4, "max_memory": 8 * GIB, "resize_timeout_s": 60, **changes}
    return {k: v for k, v in limits.items() if v is not ...}


# (document, the exact message after "error: <file>: ")
BAD: list[tuple[dict[str, Any], str]] = [
    # the top level
    (scenario(version=2), "version: 2 is not supported; this reads version 1"),
    (
        scenario(version=...),
        "version: is missing; expected 1 (this reads version 1 of bench/SCENARIO.md)",
    ),
    (scenario(name=""), "name: '' is empty; expected a non-empty string"),
    (scenario(groups=[]), "groups: expected an object, got a list"),
    (
        scenario(groups=...),
        "groups: is missing; expected an object of worker groups by name (bench/SCENARIO.md)",
    ),
    (
        scenario(demand=[{"shape": {"CPU": 1}}]),
        "scenario: unknown key 'demand' (did you mean 'demands'?)",
    ),
    (scenario(Pods=[]), "scenario: unknown key 'Pods' (did you mean 'pods'?)"),
    (
        scenario(comment="x"),
        "scenario: unknown key 'comment'; expected one of version, name, max_workers, "
        "idle_timeout_s, settings, groups, pods, demands, gangs, constraints",
    ),
    (
        scenario(resize_policy="max"),
        "scenario: unknown key 'resize_policy' (it belongs in settings)",
    ),
    (
        scenario(max_workers=-1),
        "max_workers: -1 is negative; expected a non-negative whole number, or null for no cap",
    ),
    (
        scenario(max_workers=2.5),
        "max_workers: 2.5 is not a whole number; expected a non-negative whole number, or null "
        "for no cap",
    ),
    (
        scenario(idle_timeout_s=-1),
        "idle_timeout_s: -1 is negative; expected a non-negative number of seconds",
    ),
    (
        scenario(idle_timeout_s="60"),
        "idle_timeout_s: '60' is not a number; expected a non-negative number of seconds",
    ),
    # settings: every field
    (
        scenario(settings={"cpu_step": 0}),
        "settings.cpu_step: 0 is not positive; expected a positive number of cores",
    ),
    (
        scenario(settings={"cpu_step": -0.5}),
        "settings.cpu_step: -0.5 is negative; expected a positive number of cores",
    ),
    (
        scenario(settings={"cpu_step": "1"}),
        "settings.cpu_step: '1' is not a number; expected a positive number of cores",
    ),
    (
        scenario(settings={"cpu_step": 1e300}),
        "settings.cpu_step: 1e+300 is too large; expected a non-negative number of cores, at "
        "most 9223372036854775.807",
    ),
    (
        scenario(settings={"memory_step": 0}),
        "settings.memory_step: 0 is below 1; expected a whole number of bytes, at least 1",
    ),
    (
        scenario(settings={"memory_step": 1.5}),
        "settings.memory_step: 1.5 is not a whole number; expected a whole number of bytes, at "
        "least 1",
    ),
    (
        scenario(settings={"resize_policy": "biggest"}),
        "settings.resize_policy: 'biggest' is not one of right-size, max",
    ),
    (
        scenario(settings={"upscaling_mode": "Fast"}),
        "settings.upscaling_mode: 'Fast' is not one of Conservative, Default, Aggressive",
    ),
    (
        scenario(settings={"cpu_stp": 1}),
        "settings: unknown key 'cpu_stp' (did you mean 'cpu_step'?)",
    ),
    (
        scenario(settings={"idle_timeout_s": 5}),
        "settings: unknown key 'idle_timeout_s' (it belongs at the top level)",
    ),
    (scenario(settings=[]), "settings: expected an object, got a list"),
    # groups
    (
        scenario(groups={"": SEED_CASE_2["groups"]["g1"]}),
        "groups: '' is not a group name; expected a non-empty name",
    ),
    (
        scenario(groups=with_group(resources=...)),
        'groups.g1.resources: is missing; expected a new pod\'s size, like {"CPU": 1, '
        '"memory": 2147483648}',
    ),
    (
        scenario(groups=with_group(maxworkers=3)),
        "groups.g1: unknown key 'maxworkers' (did you mean 'max_workers'?)",
    ),
    (
        scenario(groups=with_group(min_workers=3, max_workers=2)),
        "groups.g1.min_workers: 3 is above max_workers 2; expected at most 2",
    ),
    (
        scenario(groups=with_group(max_workers=-1)),
        "groups.g1.max_workers: -1 is negative; expected a non-negative whole number, or null "
        "for no cap",
    ),
    (
        scenario(groups=with_group(labels={"zone": 1})),
        "groups.g1.labels.zone: 1 is not a string; expected a string label value",
    ),
    (
        scenario(groups=with_group(ippr=ippr(max_cpu=0.5))),
        "groups.g1.ippr.max_cpu: 0.5 is below the group's resources.CPU 1; expected at least 1 "
        "(a pod starts at its group's size)",
    ),
    (
        scenario(groups=with_group(ippr=ippr(max_memory=GIB))),
        "groups.g1.ippr.max_memory: 1073741824 is below the group's resources.memory "
        "2147483648; expected at least 2147483648 (a pod starts at its group's size)",
    ),
    (
        scenario(groups=with_group(ippr=ippr(max_cpu=0))),
        "groups.g1.ippr.max_cpu: 0 is not positive; expected a positive number of cores",
    ),
    (
        scenario(groups=with_group(ippr=ippr(resize_timeout_s=...))),
        "groups.g1.ippr.resize_timeout_s: is missing; expected whole seconds a resize may take, "
        "like 60",
    ),
    (
        scenario(groups=with_group(ippr=ippr(resize_timeout_s=0))),
        "groups.g1.ippr.resize_timeout_s: 0 is below 1; expected a whole number of seconds, at "
        "least 1",
    ),
    (
        scenario(groups=with_group(ippr=ippr(resize_timeout_s=..., resize_timeout=60))),
        "groups.g1.ippr: unknown key 'resize_timeout' (did you mean 'resize_timeout_s'?)",
    ),
    # pods
    (
        scenario(pods=[with_pod(total=...)]),
        'pods[0].total: is missing; expected the Ray resources the pod has, like {"CPU": 1, '
        '"memory": 2147483648}',
    ),
    (
        scenario(pods=[with_pod(total={"CPU": 2}, available={"CPU": 3})]),
        "pods[0].available.CPU: 3 exceeds total 2; expected at most 2",
    ),
    (
        scenario(pods=[with_pod(available={"CPU": 1, "GPU": 1})]),
        "pods[0].available.GPU: 1 exceeds total 0; expected at most 0",
    ),
    (
        scenario(pods=[with_pod(total={"CPU": "4 cores"})]),
        "pods[0].total.CPU: '4 cores' is not a number; expected a non-negative number of cores",
    ),
    (
        scenario(pods=[with_pod(total={"CPU": 1, "memory": -1})]),
        "pods[0].total.memory: -1 is negative; expected a non-negative number of bytes",
    ),
    (
        scenario(pods=[with_pod(totl={"CPU": 1})]),
        "pods[0]: unknown key 'totl' (did you mean 'total'?)",
    ),
    (
        scenario(pods=[SEED_CASE_2["pods"][0], SEED_CASE_2["pods"][0]]),
        "pods[1].name: 'c-g1-aaaaa' appears twice (also pods[0]); expected unique pod names",
    ),
    (
        scenario(pods=[with_pod(name=None)]),
        "pods[0].name: None is not a string; expected a non-empty string",
    ),
    (
        scenario(pods=[with_pod(group="nope")]),
        "pods[0].group: 'nope' is not in groups (g1); expected one of them, or 'headgroup' for "
        "the head pod",
    ),
    (
        scenario(pods=[with_pod(group="G1")]),
        "pods[0].group: 'G1' is not in groups (did you mean 'g1'?)",
    ),
    (
        scenario(
            pods=[
                with_pod(name="h1", group="headgroup"),
                with_pod(name="h2", group="headgroup"),
            ]
        ),
        "pods[1].group: 'headgroup' again (pods[0] is the head pod); expected one head pod",
    ),
    (
        scenario(pods=[with_pod(phase="Running")]),
        "pods[0].phase: 'Running' is not one of running, pending",
    ),
    (
        scenario(pods=[with_pod(phase="pending", raylet_id="ab")]),
        "pods[0].raylet_id: 'ab' is set on a pending pod; expected null: a pending pod has no "
        'Raylet yet (or "phase": "running")',
    ),
    (
        scenario(pods=[with_pod(idle_s=-3)]),
        "pods[0].idle_s: -3 is negative; expected a non-negative number of seconds",
    ),
    (
        scenario(pods=[with_pod(resize={"state": "stuck"})]),
        "pods[0].resize.state: 'stuck' is not one of in_progress, deferred, infeasible, error, "
        "timed_out",
    ),
    (
        scenario(pods=[with_pod(resize={"cpu": 4, "failed": "no"})]),
        "pods[0].resize.failed: 'no' is not a boolean; expected true or false",
    ),
    (
        scenario(pods=[with_pod(resize={"cpu": 4, "memry": 8 * GIB})]),
        "pods[0].resize: unknown key 'memry' (did you mean 'memory'?)",
    ),
    (
        scenario(pods=[with_pod(resize={"cpu": -4})]),
        "pods[0].resize.cpu: -4 is negative; expected a non-negative number of cores",
    ),
    # demands
    (
        scenario(demands=[{"shape": {"CPU": -1}, "count": 1}]),
        "demands[0].shape.CPU: -1 is negative; expected a non-negative number of cores",
    ),
    (
        scenario(demands=[{"shape": {"CPU": 1e300}}]),
        "demands[0].shape.CPU: 1e+300 is too large; expected a non-negative number of cores, "
        "at most 9223372036854775.807",
    ),
    (
        scenario(demands=[{"count": 2}]),
        "demands[0].shape: is missing; expected the resources one task or actor asks for, like "
        '{"CPU": 1}',
    ),
    (
        scenario(demands=[{"shape": {"CPU": 1}, "count": 1.5}]),
        "demands[0].count: 1.5 is not a whole number; expected a whole number of at least 1",
    ),
    (
        scenario(demands=[{"shape": {"CPU": 1}, "count": 0}]),
        "demands[0].count: 0 is below 1; expected a whole number of at least 1",
    ),
    (
        scenario(demands=[{"shape": {"CPU": 1}, "count": -2}]),
        "demands[0].count: -2 is negative; expected a whole number of at least 1",
    ),
    (
        scenario(demands=[{"shape": {"CPU": 1}, "label_selector": {"zone": "in(a,b"}}]),
        "demands[0].label_selector.zone: 'in(a,b' is not a label selector; expected \"value\", "
        '"!value", "in(v1,v2)" or "!in(v1,v2)"',
    ),
    (
        scenario(demands=[{"shape": {"CPU": 1}, "labels": {"zone": "a"}}]),
        "demands[0]: unknown key 'labels' (did you mean 'label_selector'?)",
    ),
    # gangs
    (
        scenario(gangs=[{"bundles": [{"CPU": 1}], "strategy": "TIGHT"}]),
        "gangs[0].strategy: 'TIGHT' is not one of PACK, SPREAD, STRICT_PACK, STRICT_SPREAD",
    ),
    (
        scenario(gangs=[{"bundles": []}]),
        'gangs[0].bundles: is empty; expected at least one bundle, like [{"CPU": 1}]',
    ),
    (
        scenario(gangs=[{"strategy": "PACK"}]),
        'gangs[0].bundles: is missing; expected a list of bundles, like [{"CPU": 1}, {"CPU": 1}]',
    ),
    (
        scenario(gangs=[{"bundles": [{"CPU": 1}, {"CPU": 0}]}]),
        'gangs[0].bundles[1]: is empty; expected at least one non-zero resource, like {"CPU": '
        "1} (Ray refuses empty bundles)",
    ),
    (
        scenario(gangs=[{"bundles": [{"CPU": 1}], "count": 0}]),
        "gangs[0].count: 0 is below 1; expected a whole number of at least 1",
    ),
    (
        scenario(gangs=[{"bundles": [{"CPU": 1}], "bundle_selectors": [{}, {}]}]),
        "gangs[0].bundle_selectors: has 2 selector(s) for 1 bundle(s); expected one per bundle "
        "({} for none), or no bundle_selectors",
    ),
    (
        scenario(gangs=[{"bundle": [{"CPU": 1}]}]),
        "gangs[0]: unknown key 'bundle' (did you mean 'bundles'?)",
    ),
    # constraints
    (
        scenario(constraints=[{"shape": {"CPU": 1}, "count": 0}]),
        "constraints[0].count: 0 is below 1; expected a whole number of at least 1",
    ),
    (
        scenario(constraints=[{"shape": {"CPU": 1}, "label_selector": {}}]),
        "constraints[0]: unknown key 'label_selector'; expected one of shape, count",
    ),
]


@pytest.mark.parametrize(
    ("doc", "message"), BAD, ids=[m.split(":")[0] + ":" + m.split(":")[1][:30] for _, m in BAD]
)
def test_bad_scenarios_get_a_precise_message_and_exit_2(
    tmp_path: Path, doc: object, message: str
) -> None:
    f = write(tmp_path, doc)
    result = runner.invoke(app, ["plan", "--scenario", str(f)])
    assert (result.exit_code, result.stderr, result.stdout) == (2, f"error: {f}: {message}\n", "")


def test_invalid_json_is_refused_with_its_position(tmp_path: Path) -> None:
    f = write(tmp_path, "{not json")
    result = runner.invoke(app, ["plan", "--scenario", str(f)])
    assert (result.exit_code, result.stderr, result.stdout) == (
        2,
        f"error: {f} is not valid JSON: Expecting property name enclosed in double quotes at "
        "line 1 column 2\n",
        "",
    )


def test_a_key_given_twice_is_refused_not_silently_dropped(tmp_path: Path) -> None:
    text = json.dumps(SEED_CASE_2)[:-1] + ', "demands": []}'
    f = write(tmp_path, text)
    result = runner.invoke(app, ["plan", "--scenario", str(f)])
    assert (result.exit_code, result.stderr, result.stdout) == (
        2,
        f"error: {f}: key 'demands' appears twice in one object; JSON keeps only the last, so "
        "give it once\n",
        "",
    )


@pytest.mark.parametrize(
    ("settings", "size"),
    [
        (None, (2.0, 3 * GIB)),
        ({"cpu_step": 0.5}, (1.5, 3 * GIB)),
        ({"cpu_step": 0.5, "memory_step": GIB // 2}, (1.5, 5 * GIB // 2)),
    ],
)
def test_the_steps_round_a_right_sized_resize(
    tmp_path: Path, settings: dict[str, Any] | None, size: tuple[float, int]
) -> None:
    doc = scenario(demands=[{"shape": {"CPU": 1.5, "memory": 5 * GIB // 2}}], settings=settings)
    result = runner.invoke(app, ["plan", "-s", str(write(tmp_path, doc))])
    assert result.exit_code == 0, result.stderr
    resize = json.loads(result.stdout)["resize"]
    assert resize == [{"pod": "c-g1-aaaaa", "cpu": size[0], "memory": size[1]}]


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", "--scenario", str(tmp_path / "nope.json")])
    assert result.exit_code == 2
    assert "cannot read" in result.stderr and "No such file or directory" in result.stderr


HUGE = 10**400  # a JSON integer past float's range: json.loads keeps it exact


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        # a positive amount that Ray's rounding makes 0 millicores is refused, not 0
        (
            scenario(settings={"cpu_step": 1e-10}),
            "settings.cpu_step: 1e-10 is not positive: it rounds to 0 millicores; expected a "
            "positive number of cores",
        ),
        (
            scenario(groups=with_group(ippr=ippr(max_cpu=1e-10))),
            "groups.g1.ippr.max_cpu: 1e-10 is not positive: it rounds to 0 millicores; expected "
            "a positive number of cores",
        ),
        # an integer too large for a float is refused with a clear message, not OverflowError
        (
            scenario(idle_timeout_s=HUGE),
            f"idle_timeout_s: {HUGE} is too large; expected a non-negative number of seconds, "
            "at most 1.7976931348623157e+308",
        ),
        (
            scenario(pods=[with_pod(idle_s=HUGE)]),
            f"pods[0].idle_s: {HUGE} is too large; expected a non-negative number of seconds, at "
            "most 1.7976931348623157e+308",
        ),
        (
            scenario(settings={"cpu_step": HUGE}),
            f"settings.cpu_step: {HUGE} is too large; expected a non-negative number of cores, "
            "at most 9223372036854775.807",
        ),
        (
            scenario(demands=[{"shape": {"CPU": HUGE}}]),
            f"demands[0].shape.CPU: {HUGE} is too large; expected a non-negative number of "
            "cores, at most 9223372036854775.807",
        ),
    ],
    ids=[
        "cpu_step-1e-10",
        "max_cpu-1e-10",
        "idle_timeout_s-huge",
        "idle_s-huge",
        "cpu_step-huge",
        "shape-huge",
    ],
)
def test_amounts_at_the_edges_are_refused_with_a_precise_message(
    tmp_path: Path, doc: object, message: str
) -> None:
    f = write(tmp_path, doc)
    result = runner.invoke(app, ["plan", "--scenario", str(f)])
    assert (result.exit_code, result.stderr, result.stdout) == (2, f"error: {f}: {message}\n", "")


def test_a_file_that_is_not_utf8_or_nests_too_deeply_is_one_clear_line(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.json"
    bad.write_bytes(b'{"version": 1, "name": "caf\xe9"}')
    result = CliRunner().invoke(app, ["plan", "--scenario", str(bad)])
    assert result.exit_code != 0
    assert result.stderr.strip().startswith(
        f"error: {bad} is not UTF-8 text (byte 27: invalid continuation byte)"
    )
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    result = CliRunner().invoke(app, ["plan", "--scenario", str(deep)])
    assert result.exit_code != 0
    assert (
        result.stderr.strip()
        == f"error: {deep} nests too deeply to be a scenario (bench/SCENARIO.md is at most a few levels deep)"
    )


def test_a_scenario_past_the_planning_limit_is_one_clear_error(tmp_path: Path) -> None:
    """A demand of 10⁹ tasks with no maximum ran over two minutes: past the documented
    limit, `raysize plan` says so at once."""
    doc = copy.deepcopy(SEED_CASE_2)
    doc["groups"]["g1"]["max_workers"] = None
    doc["max_workers"] = None
    doc["demands"] = [{"shape": {"CPU": 1}, "count": 10**9}]
    result = runner.invoke(app, ["plan", "-s", str(write(tmp_path, doc))])
    assert result.exit_code == 2, result.output
    assert (
        "demands, gangs, constraints: 1000000000 units in all (counts × bundles); one plan "
        "places at most 100000 (bench/SCENARIO.md, Limits): lower the counts"
    ) in result.stderr
