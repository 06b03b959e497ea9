"""The layers of docs/design/architecture.md hold, and the check that enforces them (import-linter
contracts in pyproject.toml, run by `make lint`) really fails on a forbidden import."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.orchestration.temporal_env import venv_binary

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("raysize", "workflows", "activities", "worker", "sandbox", "bench", "tests")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [venv_binary("lint-imports"), "--no-cache", "--no-logo"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_repository_keeps_every_contract() -> None:
    done = lint_imports(REPO)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "BROKEN" not in done.stdout


@pytest.mark.parametrize(
    ("package", "module", "line", "contract"),
    [
        ("workflows", "probe.py", "import kubernetes", "workflows/ decide"),
        (
            "activities",
            "probe.py",
            "from raysize.workflows.reconcile_workflow import ReconcileWorkflow",
            "activities/ take the pure code of workflows/",
        ),
        ("worker", "run_probe.py", "import raysize.sandbox.cluster", "the product never imports"),
        ("activities", "probe.py", "from workflows.model import Plan", "one name for each module"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, package: str, module: str, line: str, contract: str
) -> None:
    """A copy of the repository's packages with one forbidden import added: the check
    fails and names the contract."""
    for name in PACKAGES:
        shutil.copytree(
            REPO / name,
            tmp_path / name,
            symlinks=True,  # raysize/ links to the folders
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    if package == "worker":  # a product module of the worker: name it in the contract
        text = (tmp_path / "pyproject.toml").read_text()
        text = text.replace(
            '"raysize.worker.run",', '"raysize.worker.run", "raysize.worker.run_probe",', 1
        )
        (tmp_path / "pyproject.toml").write_text(text)
    (tmp_path / package / module).write_text(f"{line}\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    broken = [ln for ln in done.stdout.splitlines() if " BROKEN" in ln]
    assert [b.startswith(contract) for b in broken] == [True], done.stdout[-2000:]
