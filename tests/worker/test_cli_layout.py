"""What a person sees of the `raysize` command first is the product: operations apart
from the development tools, and `raysize worker` loads none of the stand-ins."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from raysize.worker.cli import app
from raysize.worker.cli_demo import STORIES
from raysize.worker.demo_scenarios import SCENARIOS

STAND_INS = (
    "raysize.sandbox",
    "raysize.worker.demo",
    "raysize.worker.demo_procs",
    "raysize.worker.demo_scenarios",
    "raysize.worker.demo_view",
    "bench",
    "tests",
    "ray",
    # the bare folders: a module loaded under two names is two modules
    "workflows",
    "activities",
    "worker",
    "sandbox",
)


def test_the_worker_command_loads_no_stand_in() -> None:
    """The CLI mounts every family at import; the sandbox, the demo, bench/, tests/ and
    Ray itself are loaded only by the commands that use them (`python -X importtime`
    lists every module the worker's entry loads)."""
    done = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-c",
            "from raysize.worker.cli import app; import raysize.worker.run",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # "import time:       self [us] |  cumulative | imported package", then a row a module
    rows = [ln.split("|")[-1].strip() for ln in done.stderr.splitlines()[1:]]
    assert "raysize.worker.run" in rows and "raysize.workflows.planner" in rows
    loaded = [m for m in rows if any(m == s or m.startswith(f"{s}.") for s in STAND_INS)]
    assert loaded == []


def test_help_lists_operations_first_and_tools_apart() -> None:
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0
    text = result.stdout
    ops, tools = text.index("Operations"), text.index("Development tools")
    assert ops < tools
    for command in ("worker", "start", "stop", "status", "pause", "resume", "cancel"):
        assert ops < text.index(f" {command} ") < tools, command
    for command in ("plan", "sandbox", "demo", "ray"):
        assert text.index(f" {command} ") > tools, command


def test_the_demo_help_names_every_story_as_the_demo_tells_it() -> None:
    assert {name: s.title for name, s in SCENARIOS.items()} == STORIES
