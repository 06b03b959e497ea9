"""Operator commands: bad input gets one clear line and a non-zero exit."""

from __future__ import annotations

import gc

import pytest
from typer.testing import CliRunner

from raysize.worker.cli import app
from raysize.worker.run import GC_THRESHOLDS

runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["status", "demo"],
            "'demo' is not <namespace>/<raycluster>; e.g. default/raycluster-demo",
        ),
        (["pause", "a/b/c"], "'a/b/c' is not <namespace>/<raycluster>"),
        (["cancel", "/c", "--pod", "p"], "'/c' is not <namespace>/<raycluster>"),
        (
            ["cancel", "default/demo"],
            "cancel needs the pod: raysize cancel <namespace>/<raycluster> --pod <pod>",
        ),
        (["start", "ns/"], "'ns/' is not <namespace>/<raycluster>"),
    ],
)
def test_bad_references_are_refused(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert result.stderr.strip().startswith(f"error: {message}")
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_setting_names_the_variable() -> None:
    result = runner.invoke(app, ["status", "ns/demo"], env={"RAYSIZE_CPU_STEP": "4 cores"})
    assert result.exit_code == 1
    assert result.stderr.startswith("error: RAYSIZE_CPU_STEP: ")
    assert "'4 cores' is not a quantity" in result.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RAYSIZE_TICK_S": "inf"}, "RAYSIZE_TICK_S: Input should be a finite number"),
        (
            {"RAYSIZE_IDLE_TIMEOUT_S": "nan"},
            "RAYSIZE_IDLE_TIMEOUT_S: Input should be a finite number",
        ),
        (
            {"RAYSIZE_DISCOVERY_INTERVAL_S": "inf"},
            "RAYSIZE_DISCOVERY_INTERVAL_S: Input should be a finite number",
        ),
        (
            {"RAYSIZE_RESIZE_POLL_INTERVAL_S": "inf"},
            "RAYSIZE_RESIZE_POLL_INTERVAL_S: Input should be a finite number",
        ),
        ({"RAYSIZE_TASK_QUEUE": ""}, "RAYSIZE_TASK_QUEUE: String should have at least 1 character"),
        (
            {"RAYSIZE_TEMPORAL_TLS_CA": "/nonexistent/ca.pem"},
            "RAYSIZE_TEMPORAL_TLS_CA: '/nonexistent/ca.pem' is not a file",
        ),
        (
            {"RAYSIZE_KUBECONFIG": "/nonexistent/kubeconfig"},
            "RAYSIZE_KUBECONFIG: '/nonexistent/kubeconfig' is not a file",
        ),
        (
            {"RAYSIZE_MAX_CONCURRENT_ACTIVITIES": "5"},
            "RAYSIZE_MAX_CONCURRENT_ACTIVITIES: Input should be greater than or equal to 10",
        ),
        (
            {"RAYSIZE_MAX_CACHED_WORKFLOWS": "10"},
            "RAYSIZE_MAX_CACHED_WORKFLOWS: Input should be greater than or equal to 100",
        ),
        (
            {"RAYSIZE_MAX_CONCURRENT_WORKFLOW_TASKS": "1"},
            "RAYSIZE_MAX_CONCURRENT_WORKFLOW_TASKS: Input should be greater than or equal to 2",
        ),
        (
            {"RAYSIZE_MAX_CONCURRENT_WORKFLOW_TASKS": "5000"},
            "RAYSIZE_MAX_CONCURRENT_WORKFLOW_TASKS (5000) is above RAYSIZE_MAX_CACHED_WORKFLOWS "
            "(4000): raise the cache, or lower the tasks to at most the cache",
        ),
        # a host alone was dialled on port 80, silently
        (
            {"RAYSIZE_TEMPORAL_ADDRESS": "localhost"},
            "RAYSIZE_TEMPORAL_ADDRESS: 'localhost' has no port: give host:port, e.g. "
            "localhost:7233",
        ),
        (
            {"RAYSIZE_GCS_ADDRESS": "ray-head"},
            "RAYSIZE_GCS_ADDRESS: 'ray-head' has no port: give host:port, e.g. ray-head:6379",
        ),
        (
            {"RAYSIZE_TEMPORAL_ADDRESS": "http://temporal:7233"},
            "RAYSIZE_TEMPORAL_ADDRESS: 'http://temporal:7233' is a URL: give host:port",
        ),
        (
            {"RAYSIZE_GCS_ADDRESS": "ray-head:637900"},
            "RAYSIZE_GCS_ADDRESS: 'ray-head:637900': the port '637900' is not a number from 1 "
            "to 65535",
        ),
        (
            {"RAYSIZE_DEPLOYMENT_NAME": "raysize.prod"},
            "RAYSIZE_DEPLOYMENT_NAME: 'raysize.prod': a deployment name may not contain '.'",
        ),
        (
            {"RAYSIZE_DEPLOYMENT_NAME": "raysize", "RAYSIZE_BUILD_ID": " "},
            "RAYSIZE_BUILD_ID: the build ID is empty: give one (e.g. 0.2.0 or the image tag), "
            "or unset it",
        ),
        (
            {"RAYSIZE_BUILD_ID": "0.2.0 rc1"},
            "RAYSIZE_BUILD_ID: '0.2.0 rc1': the build ID may not contain spaces",
        ),
        (
            {"RAYSIZE_BUILD_ID": "__unversioned__"},
            "RAYSIZE_BUILD_ID: '__unversioned__': the build ID may not start with '__'",
        ),
        (
            {"RAYSIZE_UPGRADE_CHECK_S": "0"},
            "RAYSIZE_UPGRADE_CHECK_S: Input should be greater than 0",
        ),
        (
            {"RAYSIZE_UPGRADE_CHECK_S": "inf"},
            "RAYSIZE_UPGRADE_CHECK_S: Input should be a finite number",
        ),
        (
            {"RAYSIZE_MAKE_CURRENT": "yes"},
            "RAYSIZE_MAKE_CURRENT: Input should be 'if-none', 'always' or 'never'",
        ),
        (
            {"RAYSIZE_OBSERVE_ONLY": "maybe"},
            "RAYSIZE_OBSERVE_ONLY: Input should be a valid boolean",
        ),
        (
            {"RAYSIZE_TEMPORAL_CHECK_S": "0"},
            "RAYSIZE_TEMPORAL_CHECK_S: Input should be greater than 0",
        ),
        (
            {"RAYSIZE_TEMPORAL_API_KEY_FILE": "/nonexistent/api-key"},
            "RAYSIZE_TEMPORAL_API_KEY_FILE: '/nonexistent/api-key' is not a file",
        ),
        (
            {"RAYSIZE_CLUSTER_NAME": "Prod_EU"},
            "RAYSIZE_CLUSTER_NAME: 'Prod_EU' is not a DNS label",
        ),
        ({"RAYSIZE_KUBE_QPS": "0"}, "RAYSIZE_KUBE_QPS: Input should be greater than 0"),
        ({"RAYSIZE_KUBE_QPS": "nan"}, "RAYSIZE_KUBE_QPS: Input should be a finite number"),
        (
            {"RAYSIZE_KUBE_BURST": "0"},
            "RAYSIZE_KUBE_BURST: Input should be greater than or equal to 1",
        ),
        (
            {"RAYSIZE_KUBE_BURST": "2.5"},
            "RAYSIZE_KUBE_BURST: Input should be a valid integer",
        ),
        (
            {"RAYSIZE_KUBE_THREADS": "0"},
            "RAYSIZE_KUBE_THREADS: Input should be greater than or equal to 1",
        ),
        (
            {"RAYSIZE_KUBE_THREADS": "1000"},
            "RAYSIZE_KUBE_THREADS: Input should be less than or equal to 256",
        ),
    ],
)
def test_settings_that_cannot_work_are_refused_by_name(env: dict[str, str], message: str) -> None:
    """inf would reach the workflow input as JSON null (its task then fails forever); a
    missing file used to crash later with a traceback."""
    result = runner.invoke(app, ["status", "ns/demo"], env=env)
    assert result.exit_code == 1
    assert result.stderr.strip().startswith(f"error: {message}"), result.stderr


def test_half_a_client_certificate_is_refused_not_plain_text(tmp_path) -> None:
    key = tmp_path / "client.key"
    key.write_text("not used")
    result = runner.invoke(app, ["status", "ns/demo"], env={"RAYSIZE_TEMPORAL_TLS_KEY": str(key)})
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "error: RAYSIZE_TEMPORAL_TLS_KEY is set without RAYSIZE_TEMPORAL_TLS_CERT: mTLS needs "
        "both (set both, or neither; RAYSIZE_TEMPORAL_TLS_CA alone turns on TLS without a "
        "client certificate)"
    )


def test_a_kubeconfig_that_is_not_one_is_one_clear_line(tmp_path) -> None:
    """The Kubernetes client's own error was a 64-line traceback ending in `Invalid
    kube-config file. No configuration found.`, with no path and no setting named."""
    garbage = tmp_path / "kubeconfig"
    garbage.write_text("just some text\n")
    for env in (
        {"RAYSIZE_KUBECONFIG": str(garbage)},
        {"KUBECONFIG": str(tmp_path / "empty"), "HOME": str(tmp_path)},
    ):
        if "KUBECONFIG" in env:
            (tmp_path / "empty").write_text("")
        result = runner.invoke(
            app, ["worker"], env={"RAYSIZE_TEMPORAL_ADDRESS": "127.0.0.1:9", **env}
        )
        assert result.exit_code == 1
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("error: cannot load the kubeconfig "), lines[0]
        assert "RAYSIZE_KUBECONFIG (or KUBECONFIG)" in lines[0]
        where = env.get("RAYSIZE_KUBECONFIG") or env["KUBECONFIG"]
        assert where in lines[0]


def test_unreachable_temporal_is_one_clear_line() -> None:
    result = runner.invoke(
        app, ["status", "ns/demo"], env={"RAYSIZE_TEMPORAL_ADDRESS": "127.0.0.1:9"}
    )
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: cannot reach Temporal at 127.0.0.1:9")
    assert "RAYSIZE_TEMPORAL_ADDRESS" in lines[0]


def test_a_bad_log_level_is_refused_by_flag_and_by_setting() -> None:
    flag = runner.invoke(app, ["worker", "--log-level", "LOUD"])
    assert flag.exit_code != 0
    assert "--log-level 'LOUD': expected one of DEBUG, INFO, WARNING, ERROR" in flag.stderr
    env = runner.invoke(app, ["worker"], env={"RAYSIZE_LOG_LEVEL": "loud"})
    assert env.exit_code != 0
    assert env.stderr.startswith("error: RAYSIZE_LOG_LEVEL: ")
    assert "'loud': expected one of DEBUG, INFO, WARNING, ERROR" in env.stderr


def test_the_worker_takes_observe_only_as_a_flag_too() -> None:
    result = runner.invoke(app, ["worker", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "--observe-only" in result.stdout and "RAYSIZE_OBSERVE_ONLY" in result.stdout


def test_the_worker_sets_its_garbage_collector_before_serving(tmp_path) -> None:
    """Python's default thresholds made two or three full collections a tick at 5,000
    pods (0.3–0.5 s of each tick, `bench.scale_bench`); `raysize worker` sets its own
    and freezes what start-up made, before it reads any setting that can fail."""
    garbage = tmp_path / "kubeconfig"
    garbage.write_text("just some text\n")
    before = gc.get_threshold()
    gc.unfreeze()
    try:
        result = runner.invoke(
            app,
            ["worker"],
            env={"RAYSIZE_TEMPORAL_ADDRESS": "127.0.0.1:9", "RAYSIZE_KUBECONFIG": str(garbage)},
        )
        assert result.exit_code == 1  # the kubeconfig, after the collector was set
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 10_000  # the modules of start-up, at least
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
