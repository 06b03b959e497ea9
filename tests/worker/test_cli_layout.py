"""What a person sees of the `raysize` command first is the product: operations apart
from the development tools, and `raysize worker` loads none of the stand-ins."""

from __future__ import annotations

import re
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
    # the panel each command's row stands in (a row starts with the command's name; a
    # description may use the same word, as status's "what its last plan left waiting")
    panel, where = "", {}
    for line in result.stdout.splitlines():
        if line.startswith("╭─ "):
            panel = line.removeprefix("╭─ ").split(" ─")[0]
        elif m := re.match(r"│ (\w+) {2,}\S", line):
            where[m.group(1)] = panel
    operations = ("worker", "start", "stop", "status", "pause", "resume", "cancel", "doctor")
    tools = ("plan", "demo", "sandbox", "ray")
    assert where == {c: "Operations" for c in operations} | {
        c: "Development tools (not needed to run raysize)" for c in tools
    }
    assert list(where) == [*operations, *tools]


def test_the_demo_help_names_every_story_as_the_demo_tells_it() -> None:
    assert {name: s.title for name, s in SCENARIOS.items()} == STORIES
