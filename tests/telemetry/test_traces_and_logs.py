"""One reconcile tick that grows a pod, traced and logged: the span tree ties the tick's
decision to the resize workflow and each of its activities; the log has a line per
decision and per resize outcome, with their fields."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest_asyncio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from raysize.worker.telemetry import JsonFormatter, TextFormatter, default_interceptors
from raysize.workflows.contracts import Act, ResizeOutcome, ResizeSagaState
from raysize.workflows.telemetry import DECISION_SPAN
from tests.orchestration.temporal_env import start_time_skipping

from .harness import FlakyRaylet, growing_world, reconcile_one_resize, with_interceptors

SAGA_ACTIVITIES = (Act.APPLY_RESIZE, Act.FINISH_RESIZE)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class TracedRun:
    namespace: str
    state: ResizeSagaState
    spans: tuple[ReadableSpan, ...]
    records: list[logging.LogRecord]


@pytest_asyncio.fixture(scope="module")
async def run() -> AsyncIterator[TracedRun]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    records = _Records()
    wf_log = logging.getLogger("temporalio.workflow")
    level = wf_log.level
    wf_log.setLevel(logging.INFO)
    wf_log.addHandler(records)
    env = await start_time_skipping()
    try:
        client = with_interceptors(env.client, default_interceptors(provider.get_tracer("test")))
        world = growing_world()
        ns, state = await reconcile_one_resize(client, world, FlakyRaylet(world))
    finally:
        await env.shutdown()
        wf_log.removeHandler(records)
        wf_log.setLevel(level)
    yield TracedRun(ns, state, exporter.get_finished_spans(), records.records)
    provider.shutdown()


def _one(spans: tuple[ReadableSpan, ...], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def _parent(spans: tuple[ReadableSpan, ...], span: ReadableSpan) -> ReadableSpan:
    assert span.parent is not None, f"{span.name} has no parent"
    by_id = {s.context.span_id: s for s in spans}
    return by_id[span.parent.span_id]


def test_one_resize_is_one_trace_from_the_decision_to_each_activity(run: TracedRun) -> None:
    assert run.state.outcome == ResizeOutcome.SUCCEEDED
    spans = run.spans
    resize = _one(spans, "RunWorkflow:PodResizeWorkflow")
    start_child = _parent(spans, resize)
    assert start_child.name == "StartChildWorkflow:PodResizeWorkflow"
    decision = _parent(spans, start_child)
    assert decision.name == DECISION_SPAN
    assert decision.parent is None  # each acting tick starts its own trace
    assert decision.attributes is not None
    assert decision.attributes["raysize.cluster"] == "demo"
    assert decision.attributes["raysize.namespace"] == run.namespace
    assert decision.attributes["raysize.resizes"] == 1
    trace_id = decision.context.trace_id

    # the saga's activities: started by the resize workflow, run by the worker
    for name in SAGA_ACTIVITIES:
        start = _one(spans, f"StartActivity:{name}")
        assert _parent(spans, start) is start_child  # the child's workflow context
        assert start.attributes is not None
        assert start.attributes["temporalWorkflowID"] == f"resize/{run.namespace}/w1"
        ran = _one(spans, f"RunActivity:{name}")
        assert _parent(spans, ran) is start
    complete = _one(spans, "CompleteWorkflow:PodResizeWorkflow")
    assert _parent(spans, complete) is start_child

    # the tick's own event joins the decision's trace too
    event = _one(spans, f"StartActivity:{Act.EVENT}")
    assert _parent(spans, event) is decision

    in_trace = [s for s in spans if s.context.trace_id == trace_id]
    assert {s.name for s in in_trace} >= {
        DECISION_SPAN,
        "StartChildWorkflow:PodResizeWorkflow",
        "RunWorkflow:PodResizeWorkflow",
        *(f"{kind}:{a}" for a in SAGA_ACTIVITIES for kind in ("StartActivity", "RunActivity")),
    }


def test_the_endless_reconcile_loop_is_not_one_endless_trace(run: TracedRun) -> None:
    names = [s.name for s in run.spans]
    # started without a trace context: no workflow span, and its every-tick observe and
    # wait activities make no spans (in particular no orphan root spans)
    assert "RunWorkflow:ReconcileWorkflow" not in names
    assert not [n for n in names if n.endswith((Act.OBSERVE, Act.WAIT_FOR_CHANGE))]
    start = _one(run.spans, "StartWorkflow:ReconcileWorkflow")
    decision = [s for s in run.spans if s.name == DECISION_SPAN]
    assert decision and all(d.context.trace_id != start.context.trace_id for d in decision)


def _events(run: TracedRun, event: str) -> list[dict[str, object]]:
    return [
        r.raysize  # type: ignore[attr-defined]
        for r in run.records
        if getattr(r, "raysize_event", None) == event
    ]


def test_each_decision_is_one_log_line_with_its_fields(run: TracedRun) -> None:
    decisions = _events(run, "decision")
    assert len(decisions) == 1
    d = decisions[0]
    assert d["cluster"] == "demo" and d["namespace"] == run.namespace
    assert d["action"] == "grow" and d["pod"] == "w1" and d["group"] == "g1"
    assert (d["from_cpu_m"], d["cpu_m"]) == (1000, 2000)
    assert "pending" in str(d["reason"])
    line = next(r for r in run.records if getattr(r, "raysize_event", None) == "decision")
    message = line.getMessage()
    assert message.startswith(f"decision cluster=demo namespace={run.namespace} tick=")
    assert "action=grow pod=w1 group=g1" in message and 'reason="' in message


def test_a_resize_logs_its_start_and_its_outcome(run: TracedRun) -> None:
    (start,) = _events(run, "resize-start")
    assert (start["cluster"], start["pod"], start["group"]) == ("demo", "w1", "g1")
    (outcome,) = _events(run, "resize-outcome")
    assert outcome["outcome"] == "Succeeded" and outcome["pod"] == "w1"
    assert outcome["namespace"] == run.namespace
    assert "reason" not in outcome  # a success has no failure reason


def test_formatters_render_the_fields(run: TracedRun) -> None:
    record = next(r for r in run.records if getattr(r, "raysize_event", None) == "decision")
    doc = json.loads(JsonFormatter().format(record))
    assert doc["event"] == "decision" and doc["action"] == "grow" and doc["pod"] == "w1"
    assert doc["cluster"] == "demo" and doc["level"] == "INFO"
    assert doc["workflow_id"] == f"reconcile/{run.namespace}/demo"
    text = TextFormatter().format(record)
    assert "decision cluster=demo" in text
    assert f"workflow_id=reconcile/{run.namespace}/demo" in text


async def test_tracing_survives_a_worker_that_replays_every_task() -> None:
    """No cache: each workflow task replays the history first. Spans and metrics are
    skipped while replaying and nothing they do may fail a task or break determinism."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    env = await start_time_skipping()
    try:
        client = with_interceptors(env.client, default_interceptors(provider.get_tracer("test")))
        world = growing_world()
        _, state = await reconcile_one_resize(client, world, FlakyRaylet(world), cached=False)
    finally:
        await env.shutdown()
    assert state.outcome == ResizeOutcome.SUCCEEDED
    spans = exporter.get_finished_spans()
    start_child = _one(spans, "StartChildWorkflow:PodResizeWorkflow")
    assert _parent(spans, start_child).name == DECISION_SPAN
    for name in SAGA_ACTIVITIES:  # once each: replays make no second span
        _one(spans, f"RunActivity:{name}")
