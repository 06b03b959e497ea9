"""deploy/helm/raysize/README.md is what helm-docs writes from README.md.gotmpl and the
`# --` comments of values.yaml: regenerated here and compared, so a value added or changed
without its README fails. helm-docs is built by scripts/build_control_plane.sh (cached)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from raysize.sandbox.realworld import BUILD_SCRIPT, DEFAULT_KUBERNETES_VERSION, cache_dir, parts
from tests.deploy.conftest import DEPLOY

CHART = DEPLOY / "helm" / "raysize"
# the flags `make chart-docs` passes
HELM_DOCS_ARGS = ["--chart-search-root", ".", "--skip-version-footer", "--log-level", "warning"]


def helm_docs() -> Path:
    """The helm-docs binary the build script made (it builds it when missing)."""
    env_file = cache_dir() / f"env-{DEFAULT_KUBERNETES_VERSION}"

    def built() -> Path | None:
        parts()  # the rest of the control plane, and the env file
        for line in env_file.read_text().splitlines():
            key, _, value = line.partition("=")
            if key == "helm_docs" and Path(value).exists():
                return Path(value)
        return None

    found = built()
    if found is None:  # an env file from before helm-docs was a part
        done = subprocess.run(
            ["bash", str(BUILD_SCRIPT), DEFAULT_KUBERNETES_VERSION],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        found = built()
    assert found is not None, f"{BUILD_SCRIPT.name} wrote no helm_docs line in {env_file}"
    return found


def generated_readme(chart: Path) -> str:
    done = subprocess.run(
        [str(helm_docs()), *HELM_DOCS_ARGS], cwd=chart, capture_output=True, text=True,
        timeout=60, env={"HOME": "/nonexistent", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return (chart / "README.md").read_text()


def test_the_chart_readme_is_what_helm_docs_generates(tmp_path: Path):
    copy = tmp_path / "raysize"
    shutil.copytree(CHART, copy)
    expected = generated_readme(copy)
    assert (CHART / "README.md").read_text() == expected, (
        "deploy/helm/raysize/README.md is stale: run `make chart-docs` and commit it"
    )


def test_a_changed_value_comment_changes_the_readme(tmp_path: Path):
    """The check above can fail: a `# --` comment edited without regenerating is a diff."""
    copy = tmp_path / "raysize"
    shutil.copytree(CHART, copy)
    values = copy / "values.yaml"
    text = values.read_text()
    assert "# -- Observe only" in text
    values.write_text(text.replace("# -- Observe only", "# -- Watch only"))
    readme = generated_readme(copy)
    assert readme != (CHART / "README.md").read_text()
    assert "| observeOnly | bool | `false` | Watch only" in readme


def leaves(values: object, prefix: str = "") -> set[str]:
    """The dotted keys of values.yaml that helm-docs documents: every key whose value is
    not a non-empty map (maps are documented by their keys)."""
    if isinstance(values, dict) and values:
        return {k for key, v in values.items() for k in leaves(v, f"{prefix}{key}.")}
    return {prefix.rstrip(".")}


def value_rows(readme: str) -> dict[str, str]:
    """The README's Values table: key → description."""
    table = readme[readme.index("## Values") :].splitlines()
    rows = {}
    for line in table[4:]:  # the heading, a blank line, the header and its rule
        if not line.startswith("| "):
            break
        key, _type, _default, description = line.strip("| ").split(" | ", 3)
        rows[key] = description
    return rows


def test_every_value_is_in_the_readme_with_a_description():
    rows = value_rows((CHART / "README.md").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # a map documented as a whole (resources, a security context) is one row
    missing = [
        key for key in sorted(leaves(values))
        if key not in rows and not any(key.startswith(f"{row}.") for row in rows)
    ]  # fmt: skip
    assert not missing, f"values without a `# --` comment in values.yaml: {missing}"
    assert not [key for key, description in rows.items() if not description]
    for key in ("observeOnly", "serviceAccount.create", "rbac.create", "podSecurityContext",
                "temporal.existingSecret", "metrics.serviceMonitor.enabled"):  # fmt: skip
        assert key in rows, key
