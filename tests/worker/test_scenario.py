"""The scenario format (bench/SCENARIO.md): what it documents parses, and so do the
scenarios the repository generates. The refusals are tested through `raysize plan`
(tests/worker/test_cli_plan.py), with their exact messages."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from bench.plan_bench import SIZES, generate
from raysize.worker.scenario import ScenarioError, load_scenario, parse_scenario_json
from raysize.workflows.model import KubeletResizeState, PodPhase, ResizePolicy, UpscalingMode
from raysize.workflows.resources import GIB, Resources

FORMAT_PAGE = Path(__file__).resolve().parents[2] / "bench" / "SCENARIO.md"


def documented_scenarios() -> dict[str, Any]:
    """Every scenario example on the format page, its `//` comments removed."""
    out: dict[str, Any] = {}
    for block in re.findall(r"```json\n(.*?)```", FORMAT_PAGE.read_text(), re.S):
        doc = parse_scenario_json(re.sub(r"//.*$", "", block, flags=re.M))
        if isinstance(doc, dict) and "version" in doc:
            out[doc["name"]] = doc
    return out


def test_the_format_pages_examples_parse() -> None:
    docs = documented_scenarios()
    assert sorted(docs) == ["every-key", "ippr-small"]
    for doc in docs.values():
        load_scenario(doc)


def test_every_optional_key_is_read() -> None:
    snap = load_scenario(documented_scenarios()["every-key"])
    s = snap.settings
    assert (s.upscaling_mode, s.resize_policy, s.cpu_step, s.memory_step) == (
        UpscalingMode.AGGRESSIVE,
        ResizePolicy.MAX,
        500,
        GIB // 2,
    )
    assert (s.max_workers, s.idle_timeout_s) == (10, 30)
    gpu = snap.groups["gpu"]
    assert (gpu.min_workers, gpu.max_workers, gpu.labels["zone"]) == (1, 4, "a")
    assert gpu.ippr is not None and gpu.ippr.resize_timeout_s == 120
    head, busy, pending = snap.pods
    assert head.available == head.total  # available defaults to total
    assert busy.available == Resources.of(cpu=1000, memory=8 * GIB)
    assert busy.labels["rack"] == "r1"
    assert busy.resize is not None and busy.resize.state == KubeletResizeState.DEFERRED
    assert (busy.suggested_max_cpu, busy.suggested_max_memory, busy.failed) == (6000, None, False)
    assert pending.phase == PodPhase.PENDING and pending.raylet_id is None
    assert snap.demands[0].label_selector == {"zone": "in(a,b)", "rack": "!r2"}
    assert snap.gangs[0].bundle_selectors == ({}, {"zone": "a"})
    assert snap.constraints[0].count == 3


def test_generated_bench_scenarios_parse(tmp_path: Path) -> None:
    """What `python -m bench.plan_bench` writes to bench/scenarios/, regenerated here."""
    for pods, units in [(1, 10), *SIZES]:
        f = tmp_path / f"bench-{pods}-{units}.json"
        f.write_text(json.dumps(generate(pods, units)))
        snap = load_scenario(parse_scenario_json(f.read_text()))
        assert len(snap.pods) == pods + 1


def test_a_failed_flag_on_an_error_state_is_implied() -> None:
    doc = documented_scenarios()["every-key"]
    doc["pods"][1]["resize"] = {"state": "error"}
    pod = load_scenario(doc).pods[1]
    assert pod.failed and pod.resize is None


def test_parsing_errors_are_scenario_errors_not_crashes() -> None:
    with pytest.raises(ScenarioError, match=r"^scenario: expected an object, got a list$"):
        load_scenario([])
