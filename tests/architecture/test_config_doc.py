"""docs/configuration.md is what scripts/gen_config_doc.py writes from worker/settings.py
and worker/run.py: a setting added, renamed or re-described without the page fails here,
with the command that rewrites it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from raysize.worker.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_config_doc", ROOT / "scripts" / "gen_config_doc.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configuration_page_is_what_the_code_generates() -> None:
    gen = generator()
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == gen.render(), "docs/configuration.md is stale: python scripts/gen_config_doc.py"


def test_every_setting_is_on_the_page_once() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    for name in Settings.model_fields:
        assert page.count(f"| `RAYSIZE_{name.upper()}` |") == 1, name


def test_the_decision_settings_are_the_ones_a_loop_follows() -> None:
    """What the page says reaches a loop at its next tick is what `loop_settings` sends
    (issue #43 item 5): read from the code, so the page cannot claim more."""
    gen = generator()
    applies = gen.when_it_applies()
    next_tick = {name for name, when in applies.items() if when == gen.NEXT_TICK}
    assert next_tick == {
        "tick_s", "max_concurrent_resizes", "resize_poll_interval_s",
        "idle_timeout_s", "raylet_start_timeout_s", "resize_policy", "cpu_step", "memory_step",
    }  # fmt: skip
    assert {n for n, w in applies.items() if w == gen.NEXT_ROUND} == {
        "namespaces",
        "discovery_interval_s",
    }


def test_the_page_names_every_flag_of_raysize_worker() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert "`--observe-only`" in page and "`--log-level`" in page
