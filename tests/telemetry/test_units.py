"""The small pure parts: failure reasons, key=value rendering, settings, log setup."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from pydantic import ValidationError
from temporalio import activity, workflow

from worker.settings import Settings
from worker.telemetry import JsonFormatter, TextFormatter, _otlp_headers, configure_logging
from workflows.telemetry import failure_reason, logfmt


@pytest.mark.parametrize(
    ("detail", "reason"),
    [
        ("Pod resize timed out after 300s", "timeout"),
        ("Pod resize timed out after 30s; rolling back failed: x", "timeout"),
        ("canceled by operator", "canceled"),
        ("gave up after 3 attempts", "max_attempts"),
        ('Kubernetes refused the resize: Pod "w1" is invalid', "refused"),
        ("resize Deferred: no room on the node (Node didn't have enough)", "deferred"),
        ("resize Infeasible: Node didn't have enough capacity", "infeasible"),
        ("activity failed: Activity task failed", "activity_error"),
        ("cannot decrease memory limits: below current usage", "kubelet_error"),
        ("", "unknown"),
    ],
)
def test_failure_reasons_are_a_small_fixed_set(detail: str, reason: str) -> None:
    assert failure_reason(detail) == reason


def test_logfmt_quotes_what_needs_quoting() -> None:
    line = logfmt(
        {"cluster": "demo", "reason": '1 × {CPU: 2} "pending"', "n": 3, "s": 1.23456, "x": None}
    )
    assert line == r'cluster=demo reason="1 × {CPU: 2} \"pending\"" n=3 s=1.235'
    assert logfmt({"empty": ""}) == 'empty=""'


def test_log_settings_default_and_validate(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (Settings().log_level, Settings().log_format) == ("INFO", "text")
    assert Settings().prometheus_bind is None
    monkeypatch.setenv("RAYSIZE_LOG_FORMAT", "json")
    monkeypatch.setenv("RAYSIZE_PROMETHEUS_BIND", "0.0.0.0:9464")
    assert Settings().log_format == "json" and Settings().prometheus_bind == "0.0.0.0:9464"
    monkeypatch.setenv("RAYSIZE_LOG_FORMAT", "xml")
    with pytest.raises(ValidationError):
        Settings()


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    on_message = workflow.logger.workflow_info_on_message, activity.logger.activity_info_on_message
    try:
        yield
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)
        workflow.logger.workflow_info_on_message = on_message[0]
        activity.logger.activity_info_on_message = on_message[1]


@pytest.mark.usefixtures("restore_logging")
def test_configure_logging_sets_level_and_format() -> None:
    configure_logging("warning", "json")
    root = logging.getLogger()
    assert root.level == logging.WARNING
    assert isinstance(root.handlers[-1].formatter, JsonFormatter)
    assert workflow.logger.workflow_info_on_message is False  # context goes into fields
    configure_logging("DEBUG", "text")
    assert root.level == logging.DEBUG and len(root.handlers) == 1
    assert isinstance(root.handlers[0].formatter, TextFormatter)


def test_json_formatter_plain_record() -> None:
    record = logging.LogRecord("raysize.worker", logging.INFO, __file__, 1, "hi %s", ("x",), None)
    doc = json.loads(JsonFormatter().format(record))
    assert doc["msg"] == "hi x" and doc["logger"] == "raysize.worker" and doc["level"] == "INFO"


def test_otlp_headers_follow_the_exporter_spec() -> None:
    env = {"OTEL_EXPORTER_OTLP_HEADERS": "api-key=a%20b, x=1"}
    assert _otlp_headers(env, "METRICS") == {"api-key": "a b", "x": "1"}
    env["OTEL_EXPORTER_OTLP_METRICS_HEADERS"] = "only=metrics"
    assert _otlp_headers(env, "METRICS") == {"only": "metrics"}
    assert _otlp_headers({}, "TRACES") is None
