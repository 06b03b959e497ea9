"""The small pure parts: failure reasons, key=value rendering, settings, log setup."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError
from temporalio import activity, workflow

from raysize.worker.settings import Settings
from raysize.worker.telemetry import JsonFormatter, TextFormatter, _otlp_headers, configure_logging
from raysize.workflows import telemetry
from raysize.workflows.contracts import FailureCause
from raysize.workflows.telemetry import logfmt

ROOT = Path(__file__).resolve().parents[2]


def test_failure_reasons_are_a_small_fixed_set_of_types_the_guide_lists() -> None:
    """The `reason` label of the resize counters is a `FailureCause`, set where the saga
    fails: not read back from its message, so rewording one changes no metric."""
    guide = (ROOT / "docs" / "metrics.md").read_text()
    listed = re.search(r"`reason` is one of ((?:`[a-z_]+`,?\s*)+)", guide)
    assert listed is not None
    assert set(re.findall(r"`([a-z_]+)`", listed.group(1))) == {c.value for c in FailureCause}
    assert "failure_reason" not in vars(telemetry)
    assert all(re.fullmatch(r"[a-z_]+", c.value) for c in FailureCause)


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
