"""Traces, metrics and logs of the raysize worker, set up once per process.

- Traces: `temporalio.contrib.opentelemetry.TracingInterceptor` on the Temporal client
  (workers built from the client inherit it), specialised in `DecisionTracing` so that one
  trace is one decision: a `ReconcileDecision` span per acting reconcile tick → the resize
  children it starts → their activities. Spans are exported over OTLP/HTTP only when
  `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set;
  otherwise there is no exporter and no tracer provider at all.
- Metrics: recorded through Temporal's metric meters (replay-safe in workflows, see
  workflows/telemetry.py) and exported by the Temporal `Runtime` with the SDK's own metrics:
  a Prometheus endpoint (`RAYSIZE_PROMETHEUS_BIND`) or OTLP/HTTP
  (`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT` + /v1/metrics).
- Logs: `configure_logging` for `raysize worker`, text (`key=value`) or JSON lines.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

import opentelemetry.context
import opentelemetry.trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Link, SpanKind
from temporalio import activity, client, worker, workflow
from temporalio.contrib.opentelemetry import TracingInterceptor, TracingWorkflowInboundInterceptor
from temporalio.exceptions import ApplicationError
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    OpenTelemetryConfig,
    PrometheusConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)

from raysize.worker.settings import Settings
from raysize.workflows.contracts import Act, RayletResizeInput
from raysize.workflows.telemetry import (
    DECISION_SPAN_END_EXTERN,
    DECISION_SPAN_EXTERN,
    HISTOGRAM_BUCKETS,
    RAYLET_SYNC_RETRIES,
)

log = logging.getLogger("raysize.telemetry")

# workflows that loop for ever: a trace context handed to them would make one endless
# trace of every tick, so they start without one and open a trace per decision instead
LONG_RUNNING_WORKFLOWS = frozenset({"ReconcileWorkflow", "DiscoveryWorkflow"})


# --- tracing --------------------------------------------------------------------------------
class DecisionTracing(TracingInterceptor):
    """TracingInterceptor (the SDK's, subclassed as its docs suggest) with three changes:

    1. workflows in `LONG_RUNNING_WORKFLOWS` are started without a trace context;
    2. activities that arrive without a trace context get no orphan root span (the
       reconcile loop's observe/wait every few seconds would each make a trace);
    3. workflows get the extern functions of workflows/telemetry.decision_span: a
       zero-length root span (linked to the workflow's own span, if any) that becomes the
       current context, so what the tick starts next is part of the decision's trace.
    """

    def intercept_client(self, next: client.OutboundInterceptor) -> client.OutboundInterceptor:
        # ours sits *after* the tracing one: it sees the headers tracing just added
        return super().intercept_client(_NoContextForLoops(next, self.header_key))

    def intercept_activity(
        self, next: worker.ActivityInboundInterceptor
    ) -> worker.ActivityInboundInterceptor:
        return _TraceOnlyWithContext(super().intercept_activity(next), next, self.header_key)

    def workflow_interceptor_class(
        self, input: worker.WorkflowInterceptorClassInput
    ) -> type[TracingWorkflowInboundInterceptor]:
        cls = super().workflow_interceptor_class(input)
        input.unsafe_extern_functions[DECISION_SPAN_EXTERN] = self._begin_decision
        input.unsafe_extern_functions[DECISION_SPAN_END_EXTERN] = self._end_decision
        return cls

    def _begin_decision(
        self, name: str, attributes: Mapping[str, Any], time_ns: int
    ) -> contextvars.Token[Any] | None:
        """Called from workflow code, in the workflow's task: never raises."""
        try:
            current = opentelemetry.context.get_current()
            parent = opentelemetry.trace.get_current_span(current).get_span_context()
            span = self.tracer.start_span(
                name,
                context=opentelemetry.context.Context(),  # a new trace
                kind=SpanKind.INTERNAL,
                attributes=dict(attributes),
                links=[Link(parent)] if parent.is_valid else None,
                start_time=time_ns,
            )
            span.end(end_time=time_ns)
            return opentelemetry.context.attach(
                opentelemetry.trace.set_span_in_context(span, current)
            )
        except Exception:  # tracing must never fail a workflow task
            log.exception("decision span not created")
            return None

    def _end_decision(self, token: contextvars.Token[Any]) -> None:
        # e.g. the run was evicted mid-tick: its context is gone anyway
        with contextlib.suppress(Exception):
            opentelemetry.context.detach(token)


class _NoContextForLoops(client.OutboundInterceptor):
    def __init__(self, next: client.OutboundInterceptor, header_key: str) -> None:
        super().__init__(next)
        self.header_key = header_key

    async def start_workflow(
        self, input: client.StartWorkflowInput
    ) -> client.WorkflowHandle[Any, Any]:
        if input.workflow in LONG_RUNNING_WORKFLOWS and self.header_key in input.headers:
            input.headers = {k: v for k, v in input.headers.items() if k != self.header_key}
        return await super().start_workflow(input)


class _TraceOnlyWithContext(worker.ActivityInboundInterceptor):
    def __init__(
        self,
        traced: worker.ActivityInboundInterceptor,
        untraced: worker.ActivityInboundInterceptor,
        header_key: str,
    ) -> None:
        super().__init__(traced)  # init() reaches `untraced` through `traced`
        self.untraced = untraced
        self.header_key = header_key

    async def execute_activity(self, input: worker.ExecuteActivityInput) -> Any:
        if self.header_key in input.headers:
            return await self.next.execute_activity(input)
        return await self.untraced.execute_activity(input)


# --- activity-side metrics --------------------------------------------------------------------
class ActivityMetrics(client.Interceptor, worker.Interceptor):
    """Metrics only the activity side can see: each retried attempt of a Raylet resize
    (Temporal retries it until the GCS takes it; the workflow sees only the last).
    A client interceptor too (a no-op there), so a client hands it to its workers."""

    def intercept_activity(
        self, next: worker.ActivityInboundInterceptor
    ) -> worker.ActivityInboundInterceptor:
        return _CountRayletRetries(next)


class _CountRayletRetries(worker.ActivityInboundInterceptor):
    async def execute_activity(self, input: worker.ExecuteActivityInput) -> Any:
        info = activity.info()
        if info.activity_type in (Act.RESIZE_RAYLET, Act.FINISH_RESIZE) and info.attempt > 1:
            arg = input.args[0] if input.args else None
            attrs = (
                {"cluster": arg.cluster, "k8s_namespace": arg.namespace}
                if isinstance(arg, RayletResizeInput)
                else {}
            )
            activity.metric_meter().create_counter(
                RAYLET_SYNC_RETRIES, "Raylet resize attempts that were retries"
            ).add(1, attrs)
        return await self.next.execute_activity(input)


# --- setup ------------------------------------------------------------------------------------
@dataclass
class Telemetry:
    """What the process needs from telemetry: the Temporal runtime that exports metrics
    (None: the SDK's default, exporting nothing) and the client interceptors."""

    runtime: Runtime | None = None
    tracer_provider: TracerProvider | None = None
    metrics_export: str = "off"  # "prometheus <addr>" | "otlp <url>" | "off"
    interceptors: list[client.Interceptor] = field(default_factory=list)

    def shutdown(self) -> None:
        """Flush and stop span export (metrics stop with the runtime)."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()


def default_interceptors(tracer: opentelemetry.trace.Tracer | None = None) -> list[Any]:
    """Tracing (a no-op without a tracer provider) and the activity metrics."""
    return [DecisionTracing(tracer), ActivityMetrics()]


def _otlp_metrics_url(env: Mapping[str, str]) -> str | None:
    url = env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    if url:
        return url  # signal-specific endpoints are used as given (OTLP exporter spec)
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return base.rstrip("/") + "/v1/metrics" if base else None


def _otlp_headers(env: Mapping[str, str], signal: str) -> dict[str, str] | None:
    """`OTEL_EXPORTER_OTLP_<SIGNAL>_HEADERS`, else `OTEL_EXPORTER_OTLP_HEADERS`:
    `k1=v1,k2=v2` with URL-encoded values (the OTLP exporter spec)."""
    raw = env.get(f"OTEL_EXPORTER_OTLP_{signal}_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS")
    if not raw:
        return None
    pairs = (item.split("=", 1) for item in raw.split(",") if "=" in item)
    return {unquote(k.strip()): unquote(v.strip()) for k, v in pairs}


def _tracing_enabled(env: Mapping[str, str]) -> bool:
    return (
        bool(
            env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        )
        and env.get("OTEL_TRACES_EXPORTER", "otlp") != "none"
    )


def setup_telemetry(
    settings: Settings,
    *,
    environ: Mapping[str, str] | None = None,
    span_exporter: SpanExporter | None = None,
) -> Telemetry:
    """Build the tracer provider and the metrics runtime from settings and the standard
    `OTEL_*` variables. Call once per process (a Prometheus runtime binds its port)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf") != "http/protobuf":
        log.warning("raysize exports OTLP over HTTP only; OTEL_EXPORTER_OTLP_PROTOCOL is ignored")

    provider: TracerProvider | None = None
    if span_exporter is None and _tracing_enabled(env):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        span_exporter = OTLPSpanExporter(  # timeout, compression, TLS: from OTEL_* as usual
            endpoint=env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            or env["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces",
            headers=_otlp_headers(env, "TRACES"),
        )
    if span_exporter is not None:
        service = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": "raysize"}
        provider = TracerProvider(resource=Resource.create(service))
        provider.add_span_processor(BatchSpanProcessor(span_exporter))

    buckets = {name: list(b) for name, b in HISTOGRAM_BUCKETS.items()}
    metrics: PrometheusConfig | OpenTelemetryConfig | None = None
    export = "off"
    otlp_url = _otlp_metrics_url(env)
    if settings.prometheus_bind:
        metrics = PrometheusConfig(
            bind_address=settings.prometheus_bind, histogram_bucket_overrides=buckets
        )
        export = f"prometheus http://{settings.prometheus_bind}/metrics"
        if otlp_url:
            log.warning("RAYSIZE_PROMETHEUS_BIND is set: metrics are not sent over OTLP")
    elif otlp_url and env.get("OTEL_METRICS_EXPORTER", "otlp") != "none":
        metrics = OpenTelemetryConfig(
            url=otlp_url,
            headers=_otlp_headers(env, "METRICS"),
            http=True,
            histogram_bucket_overrides=buckets,
        )
        export = f"otlp {otlp_url}"
    core_logs = core_logging(settings.log_format)
    runtime = (
        Runtime(telemetry=TelemetryConfig(metrics=metrics, logging=core_logs))
        if metrics or core_logs is not LoggingConfig.default
        else None
    )

    tracer = provider.get_tracer("raysize") if provider else None
    return Telemetry(
        runtime=runtime,
        tracer_provider=provider,
        metrics_export=export,
        interceptors=default_interceptors(tracer),
    )


# --- logs -------------------------------------------------------------------------------------
# the Temporal core's own log lines (its gRPC retries, say) go through Python's logging under
# this name, so the worker's handler formats them: with RAYSIZE_LOG_FORMAT=json, every line
# of the worker is JSON (the core otherwise writes its own coloured text to stderr)
CORE_LOGGER = "temporalio.core"


def core_logging(fmt: str) -> LoggingConfig:
    """The core's logging: forwarded to `CORE_LOGGER` for JSON, the SDK's default (the
    core's compact lines on stderr) for text."""
    if fmt != "json":
        return LoggingConfig.default
    return LoggingConfig(
        filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
        # one logger name (the core's target, e.g. temporalio_client::retry, starts the
        # message instead)
        forwarding=LogForwardingConfig(
            logger=logging.getLogger(CORE_LOGGER), append_target_to_name=False
        ),
    )


_CONTEXT_KEYS = ("workflow_id", "run_id", "activity_type", "attempt")


def _temporal_context(record: logging.LogRecord) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for attr in ("temporal_workflow", "temporal_activity"):
        info = getattr(record, attr, None)
        if isinstance(info, dict):
            out.update({k: info[k] for k in _CONTEXT_KEYS if k in info})
    return out


class TextFormatter(logging.Formatter):
    """`time level logger message k=v ...`: the workflow or activity a line came from is
    appended as key=value (instead of the SDK's Python-dict suffix)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        from raysize.workflows.telemetry import logfmt

        line = super().format(record)
        context = _temporal_context(record)
        return f"{line} {logfmt(context)}" if context else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, msg, a decision's fields, and the
    workflow or activity it came from."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
        }
        event = getattr(record, "raysize_event", None)
        fields = getattr(record, "raysize", None)
        if event and isinstance(fields, dict):
            doc["event"] = event
            doc.update(fields)
        else:
            doc["msg"] = record.getMessage()
        doc.update(_temporal_context(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class QuietRetries(logging.Filter):
    """Expected failures in one line, and the same line at most once a minute.

    An activity that fails with one of raysize's typed errors (`ApplicationError`: "cannot
    reach the Kubernetes API at …: Connection refused") already says what is wrong;
    Temporal's `Completing activity as failed` would add a traceback of ~40 lines to it,
    every retry (an API server that is down made 818 lines in 40 s). Such a record keeps
    its one line; a bug (any other exception) keeps its traceback. A line repeated within
    `window_s` is held back and counted, and the next one that passes says how many."""

    def __init__(self, window_s: float = 60.0) -> None:
        super().__init__()
        self.window_s = window_s
        self._last: dict[tuple[str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, ApplicationError) and record.name.startswith("temporalio"):
            kind = f"{exc.type}: " if exc.type else ""
            record.msg = f"{record.getMessage()}: {kind}{exc.message}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, record.getMessage())
        now = record.created
        last, held = self._last.get(key, (0.0, 0))
        if now - last < self.window_s:
            self._last[key] = (last, held + 1)
            return False
        self._last[key] = (now, 0)
        if held:
            record.msg = f"{record.getMessage()} (and {held} more like it in the last minute)"
            record.args = None
        if len(self._last) > 1000:  # bounded: forget the oldest half
            for k in sorted(self._last, key=lambda k: self._last[k][0])[:500]:
                del self._last[k]
        return True


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Once per process (`raysize worker`): root handler on stderr, the level, the format.
    Workflow and activity context goes into fields, not into the message."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(QuietRetries())
    # the Kubernetes client's own retries would log a warning per attempt; raysize retries
    # (and says so) itself
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    workflow.logger.workflow_info_on_message = False
    activity.logger.activity_info_on_message = False
