"""The README is the users' guide, in the order a user needs it; what it moved out for
contributors is where it points, and CI's command is the one it tells people to run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_sections_come_in_the_order_a_user_needs_them() -> None:
    headings = re.findall(r"(?m)^## (.+)$", README)
    assert headings == [
        "Quick start", "Demo", "Deploy", "Upgrading raysize", "Operate", "Configure",
        "Troubleshoot", "How it works", "Benchmarks", "Contributing",
    ]  # fmt: skip
    contents = re.search(r"Contents: (.*?)\(", README, flags=re.DOTALL)
    assert contents is not None
    assert re.findall(r"\*([^*]+)\*", contents.group(1)) == headings


def test_the_readmes_test_command_is_what_ci_runs() -> None:
    """.ci/run runs "exactly the README's test command": the Quick start's."""
    ci = [
        ln.strip()
        for ln in (ROOT / ".ci" / "run").read_text().splitlines()
        if ln.strip() and not ln.startswith("#") and not ln.startswith(("set ", "cd "))
    ]
    assert ci == ["make test"]
    quick = README[README.index("## Quick start\n") : README.index("\n## Demo\n")]
    (block,) = re.findall(r"```bash\n(.*?)```", quick, flags=re.DOTALL)
    assert [ln.split("#")[0].strip() for ln in block.splitlines()] == ["make demo", "make test"]


def test_the_files_it_points_to_exist() -> None:
    for target in re.findall(r"\]\(([^)#:]+)\)", README):
        assert (ROOT / target).exists(), target
    assert "CONTRIBUTING.md" in re.findall(r"\]\(([^)#:]+)\)", README)
    assert "docs/design/test-worlds.md" in re.findall(r"\]\(([^)#:]+)\)", README)
