"""What a person sees of the `raysize` command first is the product: operations apart
from the development tools, and `raysize worker` loads none of the stand-ins."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from worker.cli import app
from worker.cli_demo import STORIES
from worker.demo_scenarios import SCENARIOS

STAND_INS = ("sandbox", "worker.demo", "worker.cli_demo_", "bench", "tests", "ray")


def test_the_worker_command_loads_no_stand_in() -> None:
    """The CLI mounts every family at import; the sandbox, the demo, bench/, tests/ and
    Ray itself are loaded only by the commands that use them."""
    probe = (
        "import sys; from worker.cli import app; import worker.run; "
        "print('\\n'.join(sorted(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = [
        m for m in done.stdout.split() if m.split(".")[0] in STAND_INS or m.startswith(STAND_INS)
    ]
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
