"""Worker Versioning settings: which version a worker runs as, and from where."""

from __future__ import annotations

import pytest
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.workflow import _Definition

import raysize
from raysize.worker.deployment import deployment_config, describe_versioning
from raysize.worker.run import WORKFLOWS
from raysize.worker.settings import Settings, package_build_id
from raysize.workflows.versioning import BEHAVIOR, WORKER_DEFAULT


@pytest.fixture(autouse=True)
def _no_controller_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TEMPORAL_DEPLOYMENT_NAME", "TEMPORAL_WORKER_BUILD_ID"):
        monkeypatch.delenv(name, raising=False)
    for name in ("RAYSIZE_DEPLOYMENT_NAME", "RAYSIZE_BUILD_ID", "RAYSIZE_MAKE_CURRENT"):
        monkeypatch.delenv(name, raising=False)


def test_without_a_deployment_name_the_worker_is_unversioned() -> None:
    settings = Settings()
    assert settings.deployment_version() is None
    assert deployment_config(settings) is None
    assert describe_versioning(settings).startswith("unversioned worker")


def test_the_build_id_defaults_to_the_package_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYSIZE_DEPLOYMENT_NAME", "raysize")
    assert package_build_id() == raysize.__version__  # pyproject and __init__ agree
    config = deployment_config(Settings())
    assert config is not None
    assert config.version == WorkerDeploymentVersion("raysize", package_build_id())
    assert config.use_worker_versioning
    assert config.default_versioning_behavior == VersioningBehavior.PINNED
    assert f"raysize.{package_build_id()}" in describe_versioning(Settings())
    assert "the package version" in describe_versioning(Settings())


def test_raysize_settings_win_over_the_controllers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPORAL_DEPLOYMENT_NAME", "ops/raysize")
    monkeypatch.setenv("TEMPORAL_WORKER_BUILD_ID", "5d8c7f9b4")
    assert Settings().deployment_version() == WorkerDeploymentVersion("ops/raysize", "5d8c7f9b4")
    monkeypatch.setenv("RAYSIZE_BUILD_ID", "0.2.0")
    monkeypatch.setenv("RAYSIZE_DEPLOYMENT_NAME", "raysize")
    assert Settings().deployment_version() == WorkerDeploymentVersion("raysize", "0.2.0")


def test_every_workflow_type_has_the_workers_behaviour() -> None:
    """The worker sets one behaviour for all types (the server refuses one from an
    unversioned worker's @workflow.defn): every registered type must want that one."""
    names = {_Definition.must_from_class(w).name for w in WORKFLOWS}
    assert set(BEHAVIOR) == names
    assert set(BEHAVIOR.values()) == {WORKER_DEFAULT}
    # and none declares its own, which an unversioned worker's tasks would carry
    for w in WORKFLOWS:
        assert _Definition.must_from_class(w).versioning_behavior in (
            None,
            VersioningBehavior.UNSPECIFIED,
        )


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("RAYSIZE_TAKEOVER_AFTER_S", "0", "takeover_after_s"),
        (
            "RAYSIZE_RAY_TOKEN_FOR",
            "team a",
            r"ray_token_for\n.*'team a' is not '\*', a namespace or",
        ),
        ("RAYSIZE_WORKFLOW_TASK_POLLS", "1", "workflow_task_polls"),
    ],
)
def test_a_bad_new_setting_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, says: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=says):
        Settings()
