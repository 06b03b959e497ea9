"""deploy/Dockerfile, read as text (no Docker here): slim, non-root, the worker as entrypoint."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, ROOT, dockerignore_patterns, one, render

DOCKERFILE = DEPLOY / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "a continued line never ends"
    return out


@pytest.fixture(scope="module")
def stages() -> list[list[tuple[str, str]]]:
    """The build stages, each a list of instructions starting with its FROM."""
    result: list[list[tuple[str, str]]] = []
    for ins in instructions(DOCKERFILE.read_text()):
        if ins[0] == "FROM":
            result.append([])
        assert result, "an instruction before the first FROM"
        result[-1].append(ins)
    return result


def args_of(stage: list[tuple[str, str]], word: str) -> list[str]:
    return [a for w, a in stage if w == word]


def test_every_stage_is_slim_python_311(stages):
    for stage in stages:
        image = stage[0][1].split()[0]
        assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", image), image


def test_final_stage_runs_as_a_numeric_non_root_user(stages):
    final = stages[-1]
    users = args_of(final, "USER")
    assert users, "no USER in the final stage: the image would run as root"
    user = users[-1].split(":")[0]
    assert user.isdigit() and int(user) != 0, user
    # USER comes after every RUN (a later RUN would run as someone else)
    words = [w for w, _ in final]
    assert max(i for i, w in enumerate(words) if w == "RUN") < words.index("USER")
    # the user exists with that uid, and the Deployment runs as the same one
    assert any(f"--uid {user}" in run for run in args_of(final, "RUN"))
    pod = one(render(DEPLOY), "Deployment", "raysize-worker")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(user)
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_entrypoint_is_the_worker(stages):
    final = stages[-1]
    (entrypoint,) = args_of(final, "ENTRYPOINT")
    assert json.loads(entrypoint) == ["raysize", "worker"]  # exec form: signals reach it
    assert not args_of(final, "CMD")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["raysize"] == "raysize.worker.cli:main"
    out = subprocess.run(
        [sys.executable, "-c", "from raysize.worker.cli import main; main()", "worker", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr


def test_installs_the_package_without_the_test_extra(stages):
    text = " ".join(a for stage in stages for w, a in stage if w == "RUN")
    assert "pip wheel" in text and "pip install" in text
    assert "[test]" not in text and "requirements" not in text
    copied = " ".join(args_of(stages[0], "COPY"))
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
    for pattern in packages:
        assert pattern.rstrip("*") in copied, pattern
    assert "pyproject.toml" in copied and "README.md" in copied  # readme is build metadata
    # the build context keeps exactly what is copied
    ignore = dockerignore_patterns()
    assert ignore[0] == "*"  # everything out, then the package back in
    for pattern in packages:
        assert f"!{pattern.rstrip('*')}/**" in ignore


def test_probes_run_in_the_image(stages):
    """The Deployment's probes call `python -m worker.health`: python is on the PATH of the
    slim image and worker.health is in the installed package."""
    deploy: dict[str, Any] = one(render(DEPLOY), "Deployment", "raysize-worker")
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["exec"]["command"][:3] == ["python", "-m", "raysize.worker.health"]
    assert (ROOT / "worker" / "health.py").exists()
    assert yaml.safe_load((DEPLOY / "worker" / "kustomization.yaml").read_text())["images"] == [
        {"name": "raysize", "newName": "raysize", "newTag": "0.2.0"}
    ]
