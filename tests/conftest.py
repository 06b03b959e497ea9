"""Test tiers, so a change can be checked at the speed it needs (`make unit` runs the
first tier in seconds; `make test` and CI run every tier):

- `unit`: pure code and offline parsing, no server, no process of its own;
- `temporal`: a real Temporal server (time-skipping or dev) with scripted activities;
- `sandbox`: the embedded Kubernetes API server and kubelet simulator;
- `real`: the real kube-apiserver, etcd and KubeRay built from Go modules;
- `ray`: real Ray 2.60 processes;
- `e2e`: everything together (Temporal, Kubernetes, Ray, a raysize worker), the demo.

A test's tier comes from its folder, or from its file where the folder holds more than
one; a test run in both worlds (`[real]` in its id) is `real` as well."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

TIERS = ("unit", "temporal", "sandbox", "real", "ray", "e2e")
BY_FOLDER = {
    "activities": "unit",
    "architecture": "unit",
    "bench": "unit",
    "workflows": "unit",
    "worker": "unit",
    "orchestration": "temporal",
    "telemetry": "temporal",
    "sandbox": "sandbox",
    "deploy": "sandbox",
    "ray": "ray",
    "demo": "e2e",
    "e2e": "e2e",
}
BY_FILE = {
    "worker/test_cli_exit.py": "temporal",
    "worker/test_cli_setup.py": "temporal",
    "worker/test_cli_status.py": "temporal",
    "worker/test_cli_cancel.py": "temporal",
    "worker/test_takeover.py": "temporal",
    "worker/test_cli_sandbox.py": "sandbox",
    "worker/test_cli_doctor.py": "sandbox",
    "deploy/test_manifests.py": "unit",
    "deploy/test_dockerfile.py": "unit",
    "deploy/test_apply_real.py": "real",
    "deploy/test_apply_real_namespaced.py": "real",
    "deploy/test_lifecycle_real.py": "real",
    "deploy/test_admission_policy.py": "real",
    "deploy/test_helm.py": "real",
    "deploy/test_helm_docs.py": "real",  # helm-docs from the control plane's build
    "deploy/test_helm_values.py": "real",
    "deploy/test_monitoring.py": "real",
    "deploy/test_readme_deploy.py": "real",
    "deploy/test_profiles_real.py": "real",  # every RBAC profile on the real API server
    "deploy/test_ray_token_secrets.py": "unit",
    "sandbox/test_podnet.py": "real",
    "sandbox/test_pod_watch_real.py": "real",
    "sandbox/test_control_plane_build.py": "real",  # reads the built control plane
    "ray/test_client_offline.py": "ray",  # offline, but it sits through a 20 s outage
    "ray/test_protos.py": "unit",
    "ray/test_rpc_errors.py": "unit",
}
HERE = Path(__file__).parent


def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: the {tier} tier (tests/conftest.py)")


def tier_of(path: Path) -> str:
    rel = path.relative_to(HERE).as_posix()
    return BY_FILE.get(rel) or BY_FOLDER.get(rel.split("/", 1)[0], "unit")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(tier_of(Path(str(item.path))))
        if "[real" in item.nodeid or "-real]" in item.nodeid or "-real-" in item.nodeid:
            item.add_marker("real")


# Each tier's time, printed at the end of every run (`make test` ends with it): the time
# of a test is its setup, call and teardown, so a shared fixture counts where it starts.
_TIER_TIMES: dict[str, list[float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = next((t for t in TIERS if t in report.keywords), "unit")
    if "real" in report.keywords:
        tier = "real"
    spent = _TIER_TIMES.setdefault(tier, [0.0, 0.0])
    spent[0] += report.duration
    if report.when == "call":
        spent[1] += 1


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if not _TIER_TIMES:
        return
    terminalreporter.section("time per tier")
    total = sum(s for s, _ in _TIER_TIMES.values())
    for tier in TIERS:
        if tier in _TIER_TIMES:
            seconds, tests = _TIER_TIMES[tier]
            terminalreporter.write_line(f"{tier:<9} {int(tests):>5} tests {seconds:>8.1f} s")
    terminalreporter.write_line(f"{'all':<9} {'':>11} {total:>8.1f} s")


def pytest_sessionfinish(session: pytest.Session) -> None:
    # scripts/run_suite.py runs three parts at once and adds up their tiers' times
    out = os.environ.get("RAYSIZE_TIER_TIMES")
    if out:
        Path(out).write_text(json.dumps(_TIER_TIMES))
