"""`scripts/build_control_plane.sh` says what it does, a line per part on stderr: a cold
build took minutes and printed nothing. Run against the cache the real world already
built (nothing is rebuilt here): every part `cached`; a part missing from the cache is
made with `building <part> ...` and `... done in N s`."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from raysize.sandbox import realworld
from raysize.sandbox.realworld import BUILD_SCRIPT, DEFAULT_KUBERNETES_VERSION, parts

PARTS = [
    f"kube-apiserver {DEFAULT_KUBERNETES_VERSION}",
    f"kube-scheduler {DEFAULT_KUBERNETES_VERSION}",
    f"kube-controller-manager {DEFAULT_KUBERNETES_VERSION}",
    "etcd v",
    "kuberay v",
    "KubeRay CRDs v",
    "karpenter v",
    "Karpenter CRDs v",
    "helm v",
    "Prometheus Operator CRDs v",
    "helm-docs v",  # the chart README's generator (tests/deploy/test_helm_docs.py)
]


def build(cache_home: Path | None, dry_run: bool) -> subprocess.CompletedProcess[str]:
    env = {**os.environ}
    if cache_home is not None:
        env["XDG_CACHE_HOME"] = str(cache_home)
    if dry_run:
        env["RAYSIZE_CONTROL_PLANE_DRY_RUN"] = "1"
    return subprocess.run(
        ["bash", str(BUILD_SCRIPT), DEFAULT_KUBERNETES_VERSION],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip


def said(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert done.returncode == 0, done.stderr
    return done.stderr.splitlines()


def test_a_built_control_plane_is_one_cached_line_per_part() -> None:
    built = parts(build=False)  # the real world's cache (make control-plane)
    lines = said(build(None, dry_run=True))
    assert len(lines) == len(PARTS)
    for line, part in zip(lines, PARTS, strict=True):
        assert line.startswith(part) and line.endswith(": cached"), lines
    assert f"kuberay {built.kuberay_version}: cached" in lines
    assert f"Prometheus Operator CRDs {built.prometheus_operator_version}: cached" in lines


def test_an_empty_cache_dry_run_names_every_part_and_builds_nothing(tmp_path: Path) -> None:
    lines = said(build(tmp_path, dry_run=True))
    assert [re.sub(r" v[\d.]+:", ":", ln) for ln in lines] == [
        re.sub(r" v[\d.]*$", "", p) + ": not built (dry run)" for p in PARTS
    ]
    assert sorted(p.name for p in (tmp_path / "raysize" / "control-plane").iterdir()) == []


def test_a_missing_part_is_made_with_its_start_and_its_time(tmp_path: Path) -> None:
    """Every part of the real cache, linked, but the KubeRay CRDs (copied from the Go module
    cache: no build); the lines come through `parts()` as they are printed."""
    built = parts(build=False)
    cache = tmp_path / "raysize" / "control-plane"
    cache.mkdir(parents=True)
    for entry in realworld.cache_dir().iterdir():
        if entry.is_dir() and entry != built.ray_operator.parent:
            (cache / entry.name).symlink_to(entry)
    operator = cache / built.ray_operator.parent.name
    operator.mkdir()
    (operator / built.ray_operator.name).symlink_to(built.ray_operator)
    lines = said(build(tmp_path, dry_run=False))
    crds = f"KubeRay CRDs {built.kuberay_version}"
    start = lines.index(next(ln for ln in lines if ln.startswith(f"building {crds} ...")))
    assert re.fullmatch(rf"building {crds} \.\.\. done in \d+ s", lines[start + 1]), lines
    assert [ln for ln in lines if ln.endswith(": cached")] == [
        ln for ln in lines if not ln.startswith(f"building {crds}")
    ]
    assert (operator / "crd" / "ray.io_rayclusters.yaml").is_file()
    assert (cache / f"env-{DEFAULT_KUBERNETES_VERSION}").is_file()


def test_parts_passes_the_build_lines_on_to_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("RAYSIZE_CONTROL_PLANE_DRY_RUN", "1")
    with pytest.raises(realworld.ControlPlaneError, match="wrote no"):
        parts()  # a dry run writes no env file: nothing to read back
    err = capfd.readouterr().err
    assert f"kube-apiserver {DEFAULT_KUBERNETES_VERSION}: not built (dry run)" in err
