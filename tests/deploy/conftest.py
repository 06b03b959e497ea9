"""Helpers for the deploy/ tests: render with kubectl's kustomize, run kubectl on a sandbox."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from raysize.sandbox.cluster import Sandbox, SandboxConfig
from raysize.sandbox.kubelet import KubeletTiming
from raysize.sandbox.realworld import RealControlPlane
from tests.orchestration.temporal_env import venv_binary

KUBECTL = venv_binary("kubectl")
ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
TRIAL = DEPLOY / "overlays" / "trial"
NAMESPACED = DEPLOY / "overlays" / "namespaced"
EXAMPLE = DEPLOY / "examples" / "raycluster-ippr.yaml"
SA_USER = "system:serviceaccount:raysize:raysize"
ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def dockerignore_patterns() -> list[str]:
    """deploy/Dockerfile.dockerignore's patterns, in order (comments and blanks dropped)."""
    return [
        line.strip()
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def run_kubectl(*args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    home = str(kubeconfig.parent) if kubeconfig else os.environ.get("HOME", "/tmp")
    env = {**os.environ, "HOME": home}
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run(
        [KUBECTL, *args], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT
    )


def render(path: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize <path>`: offline, no cluster."""
    out = run_kubectl("kustomize", str(path))
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[tuple[Sandbox, Path]]:
    """A fresh sandbox and its kubeconfig; closed after the test."""
    sb = Sandbox(SandboxConfig(nodes=1, timing=KubeletTiming(actuation_delay_s=0.0))).start()
    try:
        yield sb, sb.write_kubeconfig(tmp_path / "kubeconfig")
    finally:
        sb.close()


@pytest.fixture
def kubectl(sandbox: tuple[Sandbox, Path]) -> Callable[..., subprocess.CompletedProcess[str]]:
    _, kubeconfig = sandbox

    def call(*args: str) -> subprocess.CompletedProcess[str]:
        return run_kubectl(*args, kubeconfig=kubeconfig)

    return call


MONITORING = DEPLOY / "components" / "monitoring"


def overlay_of(tmp: Path, resources: list[str], components: list[str]) -> Path:
    """A user's overlay next to a copy of deploy/ (kustomize wants relative paths):
    `resources` and `components` are paths inside deploy/."""
    shutil.copytree(DEPLOY, tmp / "deploy", dirs_exist_ok=True)
    overlay = tmp / "mine"
    overlay.mkdir(exist_ok=True)
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [f"../deploy/{r}" for r in resources],
                "components": [f"../deploy/{c}" for c in components],
            }
        )
    )
    return overlay


@pytest.fixture(scope="session")
def dry_run_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real kube-apiserver (no KubeRay operator, no kubelet: nothing runs) with the
    Prometheus Operator's CRDs and namespace raysize, for `--dry-run=server`; its admin
    kubeconfig."""
    cp = RealControlPlane(operator=False).start()
    try:
        cp.install_crds(sorted(cp.parts.prometheus_operator_crds.glob("*.yaml")))
        admin = cp.write_kubeconfig(tmp_path_factory.mktemp("dry-run") / "admin")
        made = run_kubectl("create", "namespace", "raysize", kubeconfig=admin)
        assert made.returncode == 0, made.stderr
        yield admin
    finally:
        cp.close()
