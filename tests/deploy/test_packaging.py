"""What `pip install` puts on a machine: one `raysize` package, and in the worker image
(built from the context deploy/Dockerfile.dockerignore admits) no sandbox and no demo."""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.deploy.conftest import ROOT, dockerignore_patterns

STAND_INS = ("raysize/sandbox/", "raysize/worker/demo")


def admitted(patterns: list[str], relpath: str) -> bool:
    """Docker's rule for a context file: the last pattern that matches the path or one
    of its parent folders decides; `!` admits. (Enough of it for this .dockerignore.)"""
    parts = relpath.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    keep = True
    for pattern in patterns:
        negate = pattern.startswith("!")
        glob = pattern.lstrip("!")
        if any(fnmatch.fnmatchcase(p, glob) for p in prefixes):
            keep = negate
    return keep


def copy_tracked(dest: Path, keep: Callable[[str], bool] = lambda rel: True) -> Path:
    """The repository's tracked files that KEEP admits, copied to DEST (links as links)."""
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for rel in filter(keep, files):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        source = ROOT / rel
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    return dest


def docker_context(dest: Path) -> Path:
    """The repository as `docker build` sees it: only what the .dockerignore admits."""
    patterns = dockerignore_patterns()
    return copy_tracked(dest, lambda rel: admitted(patterns, rel))


def pip(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", *args, "--quiet", "--no-deps"],
        check=True,
        timeout=300,
        capture_output=True,
    )


def build_wheel(source: Path, out: Path) -> Path:
    pip("wheel", "--no-build-isolation", "--wheel-dir", str(out), str(source))
    (wheel,) = out.glob("raysize-*.whl")
    return wheel


def names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def top_level(listed: list[str]) -> set[str]:
    return {name.split("/")[0] for name in listed}


@pytest.fixture(scope="module")
def image_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    context = docker_context(tmp_path_factory.mktemp("context"))
    return build_wheel(context, tmp_path_factory.mktemp("image-wheel"))


def test_the_wheel_installs_only_the_raysize_package(tmp_path: Path) -> None:
    """No top-level `workflows`, `activities`, `worker` or `sandbox` to collide with
    another package's; the console script names the namespaced module."""
    wheel = build_wheel(copy_tracked(tmp_path / "src"), tmp_path / "wheel")
    listed = names(wheel)
    assert top_level(listed) == {"raysize", "raysize-0.2.0.dist-info"}
    for module in (
        "raysize/__init__.py",
        "raysize/workflows/planner/__init__.py",
        "raysize/activities/ray_proto/ray_rpc_pb2.py",
        "raysize/worker/cli.py",
        "raysize/sandbox/cluster.py",
        "raysize/worker/demo.py",
    ):
        assert module in listed, module
    assert not [n for n in listed if n.startswith("raysize/sandbox/go/")]  # Go sources
    with zipfile.ZipFile(wheel) as zf:
        entry = zf.read("raysize-0.2.0.dist-info/entry_points.txt").decode()
    assert "raysize = raysize.worker.cli:main" in entry


def test_the_image_wheel_holds_the_worker_and_no_stand_in(image_wheel: Path) -> None:
    listed = names(image_wheel)
    assert top_level(listed) == {"raysize", "raysize-0.2.0.dist-info"}
    assert [n for n in listed if n.startswith(STAND_INS)] == []
    for module in (
        "raysize/worker/run.py",
        "raysize/worker/health.py",
        "raysize/worker/cli_demo.py",
        "raysize/workflows/planner/__init__.py",
    ):
        assert module in listed, module


def installed(wheel: Path, where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`raysize ARGS` from the wheel alone, installed into WHERE (outside the repository,
    so neither the checkout nor its editable install is on the path first)."""
    site = where / "site"
    if not site.exists():
        pip("install", "--target", str(site), str(wheel))
    probe = (
        # the checkout's editable install would answer for what the wheel leaves out
        "import sys; sys.meta_path[:] = [f for f in sys.meta_path "
        "if not getattr(f, '__module__', '').startswith('__editable__')]; "
        "sys.path.insert(0, sys.argv.pop(1)); import raysize; "
        "assert raysize.__file__.startswith(sys.path[0]), raysize.__file__; "
        "from raysize.worker.cli import main; sys.argv[0] = 'raysize'; main()"
    )
    return subprocess.run(
        [sys.executable, "-c", probe, str(site), *args],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "120"},
    )


def test_the_image_runs_the_worker_and_says_the_tools_are_not_there(
    image_wheel: Path, tmp_path: Path
) -> None:
    worker = installed(image_wheel, tmp_path, "worker", "--help")
    assert worker.returncode == 0, worker.stderr
    for command, args in (
        ("demo", ["demo", "--headless"]),
        ("sandbox up", ["sandbox", "up", "--nodes", "0"]),
    ):
        done = installed(image_wheel, tmp_path, *args)
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith(f"error: `raysize {command}` needs raysize."), line
        assert "pip install 'raysize[demo]'" in line
        assert "Traceback" not in done.stderr
