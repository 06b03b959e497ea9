"""deploy/components/monitoring: the PodMonitor scrapes the worker's metrics port, every
metric and label the alert rules and the Grafana dashboard use is one raysize really
exports, every expression parses as PromQL, and the real API server accepts the objects
(server-side dry run against the Prometheus Operator's CRDs)."""

from __future__ import annotations

import ast
import importlib
import json
import re
import socket
import urllib.request
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import pytest_asyncio
from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from raysize.sandbox import temporal_servers
from raysize.worker.settings import Settings
from raysize.workflows.contracts import Act
from tests.deploy.conftest import MONITORING, ROOT, find, one, overlay_of, render, run_kubectl
from tests.orchestration.temporal_env import STARTUP, venv_binary

DASHBOARD = MONITORING / "raysize-dashboard.json"
PRODUCT = ("workflows", "activities", "worker")
METER_CALLS = {
    "create_counter": "counter",
    "create_histogram": "histogram",
    "create_histogram_float": "histogram",
    "create_histogram_timedelta": "histogram",
    "create_gauge": "gauge",
    "create_gauge_float": "gauge",
}
# Labels Prometheus adds to every series it scrapes through the PodMonitor (the Prometheus
# Operator's relabeling: the target's namespace, pod, container and endpoint, and job
# "<namespace>/<PodMonitor name>"), and the series it makes itself for each target.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "container", "endpoint"}
PROMETHEUS_SERIES = {"up": TARGET_LABELS}
# what Grafana substitutes before a query reaches Prometheus
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$namespace": ".*", "$cluster": ".*"}


# --- what raysize exports ---------------------------------------------------------------------
@dataclass(frozen=True)
class MeterCall:
    name: str
    kind: str
    module: str
    labels: frozenset[str]  # the string keys of dict literals in that module


def meter_calls_in_the_code() -> list[MeterCall]:
    """Every metric the product creates: each `meter.create_*(NAME, …)` call in its
    modules, NAME resolved in the module that makes the call."""
    calls: list[MeterCall] = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).glob("*.py")):
            tree = ast.parse(path.read_text())
            found = [
                node
                for node in ast.walk(tree)
                if isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in METER_CALLS
                and node.args
            ]
            if not found:
                continue
            module = importlib.import_module(f"{package}.{path.stem}")
            keys = frozenset(
                k.value
                for d in ast.walk(tree)
                if isinstance(d, ast.Dict)
                for k in d.keys
                if isinstance(k, ast.Constant) and isinstance(k.value, str)
            )
            for node in found:
                arg = node.args[0]
                assert isinstance(node.func, ast.Attribute)
                if isinstance(arg, ast.Constant):
                    name = arg.value
                else:
                    assert isinstance(arg, ast.Name), ast.dump(arg)
                    name = getattr(module, arg.id)
                calls.append(MeterCall(name, METER_CALLS[node.func.attr], module.__name__, keys))
    return calls


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scrape(bind: str) -> dict[str, set[str]]:
    """Series name → label names, from a Prometheus text endpoint."""
    with urllib.request.urlopen(f"http://{bind}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    series: dict[str, set[str]] = {}
    for line in text.splitlines():
        match = re.match(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? ", line)
        if match and not line.startswith("#"):
            labels = set(re.findall(r'(\w+)="', match.group(2) or ""))
            series.setdefault(match.group(1), set()).update(labels)
    return series


@activity.defn(name=Act.OBSERVE)
async def observe_fails_once() -> str:
    if activity.info().attempt == 1:
        raise RuntimeError("the API server is away")
    return "observed"


@workflow.defn(name="ObserveOnce")
class ObserveOnce:
    @workflow.run
    async def run(self) -> str:
        return str(
            await workflow.execute_local_activity(  # as the reconcile loop runs it
                Act.OBSERVE,
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=100)),
            )
        )


@dataclass(frozen=True)
class Exported:
    series: dict[str, set[str]]  # what the worker's Prometheus endpoint serves
    raysize_labels: set[str]  # the attribute keys of the modules that create raysize_*


@pytest_asyncio.fixture(scope="module")
async def exported() -> AsyncIterator[Exported]:
    """The series names a worker's Prometheus endpoint (RAYSIZE_PROMETHEUS_BIND) serves:
    each metric raysize's code creates, recorded once through the Temporal runtime that
    exports them; and the SDK's own metrics after an observe_cluster local activity failed once
    on a real (test) Temporal server."""
    calls = meter_calls_in_the_code()
    assert {c.name for c in calls} >= {"raysize_resizes_started", "raysize_raylet_sync_retries"}
    bind = f"127.0.0.1:{free_port()}"
    runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=bind)))
    meter = runtime.metric_meter
    for call in calls:
        if call.kind == "counter":
            meter.create_counter(call.name).add(1)
        elif call.kind == "histogram":
            meter.create_histogram_float(call.name).record(1.0)
        else:
            meter.create_gauge_float(call.name).set(1.0)
    env = await temporal_servers.start_time_skipping(
        test_server_existing_path=venv_binary("temporal-test-server"),
        test_server_startup_timeout=STARTUP,
        runtime=runtime,
    )
    try:
        queue = f"q-{uuid.uuid4()}"
        async with Worker(
            env.client,
            task_queue=queue,
            workflows=[ObserveOnce],
            activities=[observe_fails_once],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            result = await env.client.execute_workflow(
                ObserveOnce.run, id=f"observe-{uuid.uuid4()}", task_queue=queue
            )
        assert result == "observed"
    finally:
        await env.shutdown()
    labels = {label for c in calls for label in c.labels}
    yield Exported(series=scrape(bind), raysize_labels=labels)


# --- what the rules and the dashboard use -----------------------------------------------------
def rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (rule,) = find(docs, "PrometheusRule")
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target and template variable."""
    dash = json.loads(DASHBOARD.read_text())
    out = [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            # label_values(<selector>, <label>) is Grafana's, not PromQL: check the selector
            inner = re.fullmatch(r"label_values\((.*), (\w+)\)", var["query"]["query"])
            assert inner, var["query"]
            out.append((f"${var['name']}", inner.group(1)))
    return out


def grafana_to_promql(expr: str) -> str:
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, expr
    return expr


@dataclass
class Uses:
    """The series and labels an expression reads."""

    selectors: list[tuple[str, set[str]]]  # (series name, labels matched on)
    grouping: set[str]  # labels named in by/without/on/ignoring


def uses(expr: Any, out: Uses | None = None) -> Uses:
    out = out or Uses([], set())
    if isinstance(expr, promql_parser.VectorSelector):
        assert expr.name, f"a selector without a metric name: {expr}"
        out.selectors.append((expr.name, {m.name for m in expr.matchers.matchers}))
        return out
    modifier = getattr(expr, "modifier", None)
    if isinstance(expr, promql_parser.AggregateExpr) and modifier is not None:
        out.grouping |= set(modifier.labels)
    if isinstance(expr, promql_parser.BinaryExpr) and modifier is not None:
        matching = modifier.matching
        if matching is not None:
            out.grouping |= set(matching.labels)
    for attr in ("lhs", "rhs", "expr", "param", "vector_selector"):
        child = getattr(expr, attr, None)
        if child is not None:
            uses(child, out)
    for arg in getattr(expr, "args", None) or []:
        uses(arg, out)
    return out


def check_against_exports(expr: str, exported: Exported) -> list[str]:
    """What in `expr` is not exported: unknown series, or labels they do not carry."""
    parsed = uses(promql_parser.parse(expr))
    problems: list[str] = []
    grouped_by: set[str] = set(parsed.grouping)
    for name, labels in parsed.selectors:
        if name in PROMETHEUS_SERIES:
            known = PROMETHEUS_SERIES[name]
        elif name not in exported.series:
            problems.append(f"{name}: not an exported series")
            continue
        else:
            known = TARGET_LABELS | (
                exported.raysize_labels | {"le"}
                if name.startswith("raysize_")
                else exported.series[name]
            )
        problems += [f"{name}: no label {label}" for label in labels - known]
        grouped_by -= known
    problems += [f"grouped by {label}, which no series carries" for label in grouped_by]
    return problems


@pytest.fixture(scope="module")
def monitoring(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return render(overlay_of(tmp_path_factory.mktemp("mon"), ["base"], ["components/monitoring"]))


# --- tests ------------------------------------------------------------------------------------
def test_the_pod_monitor_scrapes_the_workers_metrics_port(monitoring):
    monitor = one(monitoring, "PodMonitor", "raysize-worker")
    deploy = one(monitoring, "Deployment", "raysize-worker")
    pod = deploy["spec"]["template"]
    assert monitor["metadata"]["namespace"] == deploy["metadata"]["namespace"] == "raysize"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    # the port it scrapes is the one the worker binds its Prometheus endpoint to
    (cm,) = find(monitoring, "ConfigMap", next(iter(container["envFrom"]))["configMapRef"]["name"])
    bind = Settings(prometheus_bind=cm["data"]["RAYSIZE_PROMETHEUS_BIND"]).prometheus_bind
    assert bind is not None and int(bind.rsplit(":", 1)[1]) == ports[endpoint["port"]]
    assert endpoint["path"] == "/metrics"


def test_the_dashboard_ships_as_a_configmap_grafanas_sidecar_loads(monitoring):
    cm = one(monitoring, "ConfigMap", "raysize-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["raysize-dashboard.json"]) == json.loads(DASHBOARD.read_text())


def test_the_dashboard_has_the_panels_an_operator_asked_for():
    dash = json.loads(DASHBOARD.read_text())
    by_title = {p["title"]: p for p in dash["panels"]}
    series = {
        title: {s for _, e in dashboard_queries() if _ == title for s, _ in uses(
            promql_parser.parse(grafana_to_promql(e))).selectors}
        for title in by_title
    }  # fmt: skip
    assert series["Resizes by outcome"] == {"raysize_resize_duration_seconds_count"}
    assert series["Demand → resize latency"] == {"raysize_demand_to_resize_seconds_bucket"}
    assert series["Rollbacks by reason"] == {"raysize_resizes_rolled_back"}
    assert series["Raylet sync retries"] == {"raysize_raylet_sync_retries"}
    assert series["Plan time"] == {"raysize_plan_duration_seconds_bucket"}
    # panels do not overlap on Grafana's 24-column grid
    cells = [
        (x, y)
        for p in dash["panels"]
        for x in range(p["gridPos"]["x"], p["gridPos"]["x"] + p["gridPos"]["w"])
        for y in range(p["gridPos"]["y"], p["gridPos"]["y"] + p["gridPos"]["h"])
    ]
    assert len(cells) == len(set(cells)) and max(x for x, _ in cells) < 24
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


def test_every_series_and_label_in_the_dashboard_is_exported(exported):
    problems = {
        title: check_against_exports(grafana_to_promql(expr), exported)
        for title, expr in dashboard_queries()
    }
    assert {t: p for t, p in problems.items() if p} == {}


def test_every_series_and_label_in_the_alert_rules_is_exported(monitoring, exported):
    alerts = rules(monitoring)
    assert {r["alert"] for r in alerts} >= {
        "RaysizeWorkerAbsent",
        "RaysizeWorkerNotPolling",
        "RaysizeRollbacksRising",
        "RaysizeRayletSyncRetrying",
        "RaysizeObserveFailing",
    }
    for rule in alerts:
        assert check_against_exports(rule["expr"], exported) == [], rule["alert"]
        # the annotations' {{ $labels.x }} are labels the alert's result carries
        grouped = uses(promql_parser.parse(rule["expr"])).grouping
        text = " ".join(rule["annotations"].values())
        assert set(re.findall(r"\$labels\.(\w+)", text)) <= grouped, rule["alert"]


def test_the_sdk_counts_a_failed_observe_by_activity_type(exported):
    """The observe alert reads the Temporal SDK's metric: it is there after a failure,
    with the activity type raysize's observe runs as (a local activity: the SDK counts it
    apart from the activities)."""
    failed = exported.series["temporal_local_activity_execution_failed"]
    assert {"activity_type", "task_queue"} <= failed
    assert Act.OBSERVE == "observe_cluster"


def test_the_worker_alerts_read_the_pod_monitors_job(monitoring, exported):
    """Without metrics nothing else fires: RaysizeWorkerAbsent fires when no target of the
    PodMonitor's job is up (absent() of nothing up), RaysizeWorkerNotPolling when a worker
    is up with no poll open (the SDK's temporal_num_pollers, which a polling worker
    exports)."""
    monitor = one(monitoring, "PodMonitor", "raysize-worker")
    assert "jobLabel" not in monitor["spec"]  # so the job is "<namespace>/<name>"
    job = f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}"
    by_name = {r["alert"]: r for r in rules(monitoring)}
    absent = promql_parser.parse(by_name["RaysizeWorkerAbsent"]["expr"])
    assert isinstance(absent, promql_parser.Call) and absent.func.name == "absent"
    (inner,) = absent.args
    assert str(inner) == f'up{{job="{job}"}} == 1'
    assert by_name["RaysizeWorkerAbsent"]["labels"]["severity"] == "critical"
    polling = by_name["RaysizeWorkerNotPolling"]["expr"]
    selectors = uses(promql_parser.parse(polling)).selectors
    assert selectors == [("up", {"job"}), ("temporal_num_pollers", {"job"})]
    assert polling.count(f'job="{job}"') == 2
    assert "poller_type" in exported.series["temporal_num_pollers"]
    for rule in ("RaysizeWorkerAbsent", "RaysizeWorkerNotPolling"):
        assert by_name[rule]["for"] == "10m"


def test_every_expression_is_valid_promql(monitoring):
    exprs = [r["expr"] for r in rules(monitoring)]
    exprs += [grafana_to_promql(e) for _, e in dashboard_queries()]
    for expr in exprs:
        promql_parser.parse(expr)  # raises ValueError naming the error
    with pytest.raises(ValueError, match="parenthesis"):
        promql_parser.parse("sum by (cluster (rate(raysize_resizes_started[5m]))")
    for rule in rules(monitoring):
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical")


def test_the_real_api_server_accepts_the_monitoring_objects(dry_run_api, tmp_path: Path):
    overlay = overlay_of(tmp_path, ["base"], ["components/monitoring"])
    out = run_kubectl("apply", "--dry-run=server", "-k", str(overlay), kubeconfig=dry_run_api)
    assert out.returncode == 0, out.stderr
    for line in (
        "podmonitor.monitoring.coreos.com/raysize-worker created (server dry run)",
        "prometheusrule.monitoring.coreos.com/raysize created (server dry run)",
        "configmap/raysize-grafana-dashboard created (server dry run)",
    ):
        assert line in out.stdout
    # the CRDs' schemas are enforced: a misspelt field is refused, not dropped
    bad = tmp_path / "bad.yaml"
    monitor = one(render(overlay), "PodMonitor", "raysize-worker")
    monitor["spec"]["podMetricsEndpoint"] = monitor["spec"].pop("podMetricsEndpoints")
    bad.write_text(json.dumps(monitor))
    refused = run_kubectl("apply", "--dry-run=server", "-f", str(bad), kubeconfig=dry_run_api)
    assert refused.returncode != 0
    assert 'unknown field "spec.podMetricsEndpoint"' in refused.stderr


def test_the_render_script_draws_every_panel(tmp_path: Path):
    script = importlib.import_module("scripts.render_dashboard")
    out = tmp_path / "dashboard.png"
    drawn = script.render(json.loads(DASHBOARD.read_text()), out)
    assert drawn == len(json.loads(DASHBOARD.read_text())["panels"])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
