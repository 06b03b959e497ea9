"""Export wiring: OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is set (spans and metrics
reach a collector), nothing without it, and the Prometheus endpoint option."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import Tracer as SdkTracer
from temporalio.worker import Worker

from raysize.worker.settings import Settings
from raysize.worker.telemetry import DecisionTracing, setup_telemetry
from raysize.worker.temporal import connect
from raysize.workflows.contracts import Act, ResizeOutcome
from raysize.workflows.resize_workflow import PodResizeWorkflow
from raysize.workflows.telemetry import RESIZE_DURATION, RESIZES_STARTED
from tests.orchestration.fake_cluster import FakeCluster
from tests.orchestration.temporal_env import start_time_skipping
from tests.orchestration.test_resize_workflow import pod, request


class Collector:
    """A stand-in OTLP/HTTP collector: records every POST (path, body) and says OK."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with outer.lock:
                    outer.posts.append((self.path, body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def bodies(self, path: str) -> list[bytes]:
        with self.lock:
            return [b for p, b in self.posts if p == path]

    def span_names(self) -> set[str]:
        names = set()
        for body in self.bodies("/v1/traces"):
            req = ExportTraceServiceRequest.FromString(body)
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    names.update(s.name for s in ss.spans)
        return names

    def service_names(self) -> set[str]:
        out = set()
        for body in self.bodies("/v1/traces"):
            for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
                out.update(
                    a.value.string_value for a in rs.resource.attributes if a.key == "service.name"
                )
        return out

    def metric_names(self) -> set[str]:
        names = set()
        for body in self.bodies("/v1/metrics"):
            for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics:
                for sm in rm.scope_metrics:
                    names.update(m.name for m in sm.metrics)
        return names


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    c.thread.start()
    try:
        yield c
    finally:
        c.server.shutdown()
        c.server.server_close()


async def _eventually(check: object, seconds: float = 30) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while not check():  # type: ignore[operator]
        if loop.time() > end:
            raise AssertionError("not received in time")
        await asyncio.sleep(0.2)


async def test_spans_and_metrics_reach_the_otlp_endpoint(collector: Collector) -> None:
    await _export_through(collector)
    gc.collect()  # the runtime (and its periodic metric push) goes with the last reference


async def _export_through(collector: Collector) -> None:
    env = await start_time_skipping()
    try:
        settings = Settings(temporal_address=env.client.service_client.config.target_host)
        telemetry = setup_telemetry(
            settings, environ={"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url}
        )
        assert telemetry.tracer_provider is not None and telemetry.runtime is not None
        assert telemetry.metrics_export == f"otlp {collector.url}/v1/metrics"
        client = await connect(settings, telemetry)  # the worker's own wiring
        cluster = FakeCluster(pod())
        queue = f"q-{uuid.uuid4()}"
        async with Worker(
            client, task_queue=queue, workflows=[PodResizeWorkflow], activities=cluster.activities()
        ):
            state = await client.execute_workflow(
                PodResizeWorkflow.run, request(), id=f"resize/otlp/{uuid.uuid4()}", task_queue=queue
            )
        assert state.outcome == ResizeOutcome.SUCCEEDED
        telemetry.shutdown()  # flushes the batch of spans
        assert {
            "StartWorkflow:PodResizeWorkflow",
            "RunWorkflow:PodResizeWorkflow",
            f"StartActivity:{Act.APPLY_RESIZE}",
            f"RunActivity:{Act.APPLY_RESIZE}",  # the Raylet too, on the happy path
        } <= collector.span_names()
        assert collector.service_names() == {"raysize"}
        # the Temporal runtime pushes metrics periodically: ours ride with the SDK's
        await _eventually(lambda: RESIZES_STARTED in collector.metric_names())
        assert any(n.startswith("temporal_") for n in collector.metric_names())
    finally:
        await env.shutdown()


def test_without_an_endpoint_nothing_is_exported() -> None:
    telemetry = setup_telemetry(Settings(), environ={})
    assert telemetry.tracer_provider is None
    assert telemetry.runtime is None  # the SDK's default runtime: no metrics export
    assert telemetry.metrics_export == "off"
    tracing = next(i for i in telemetry.interceptors if isinstance(i, DecisionTracing))
    assert not isinstance(tracing.tracer, SdkTracer)  # the API's no-op (proxy) tracer
    telemetry.shutdown()


def test_otel_traces_exporter_none_turns_tracing_off(collector: Collector) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_TRACES_EXPORTER": "none"}
    telemetry = setup_telemetry(Settings(), environ={**env, "OTEL_METRICS_EXPORTER": "none"})
    assert telemetry.tracer_provider is None and telemetry.runtime is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_prometheus_endpoint_serves_raysize_histograms_in_seconds() -> None:
    bind = f"127.0.0.1:{_free_port()}"
    telemetry = setup_telemetry(Settings(prometheus_bind=bind), environ={})
    assert telemetry.runtime is not None
    assert telemetry.metrics_export == f"prometheus http://{bind}/metrics"
    histogram = telemetry.runtime.metric_meter.create_histogram_float(RESIZE_DURATION, "d", "s")
    histogram.record(3.0, {"cluster": "demo", "k8s_namespace": "ray", "outcome": "Succeeded"})

    def scrape() -> str:
        with urllib.request.urlopen(f"http://{bind}/metrics", timeout=5) as resp:
            text: str = resp.read().decode()
            return text

    text = await asyncio.to_thread(scrape)
    lines = [ln for ln in text.splitlines() if ln.startswith(f"{RESIZE_DURATION}_bucket")]
    assert any('le="2"' in ln and ln.endswith(" 0") for ln in lines), lines
    assert any('le="5"' in ln and ln.endswith(" 1") for ln in lines), lines
    assert all('cluster="demo"' in ln for ln in lines)
