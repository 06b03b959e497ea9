"""The request budget of one API server (`activities/kube_limits.py`) and the 429 error
(`k8s_errors.Throttled`): a fake clock whose sleep moves it, so timing is checked
without waiting."""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from kubernetes.client.exceptions import ApiException
from temporalio.runtime import (
    BUFFERED_METRIC_KIND_COUNTER,
    MetricBuffer,
    Runtime,
    TelemetryConfig,
)

from raysize.activities.k8s_errors import (
    Throttled,
    Unavailable,
    error_kind,
    from_api_exception,
)
from raysize.activities.kube_limits import (
    KUBE_API_ERRORS,
    KUBE_CLIENT_WAITS,
    RETRY_AFTER_CAP_S,
    KubeLimits,
    check_limits,
    retry_after_of,
)

APF_BODY = "Too many requests, please try again later.\n"  # kube-apiserver's APF, verbatim


class Clock:
    """Time that moves only when someone sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []
        self.on_sleep: list[object] = []  # callables run at the next sleeps, in order

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 9))
        self.now += seconds
        if self.on_sleep:
            self.on_sleep.pop(0)()  # type: ignore[operator]


def limits(clock: Clock, qps: float = 10, burst: int = 3, **kw: object) -> KubeLimits:
    return KubeLimits("https://api:6443", qps, burst, clock=clock, sleep=clock.sleep, **kw)


def test_a_burst_goes_at_once_then_one_call_per_token() -> None:
    clock = Clock()
    lim = limits(clock, qps=10, burst=3)
    waits = [lim.acquire() for _ in range(6)]
    assert waits == pytest.approx([0, 0, 0, 0.1, 0.1, 0.1])
    clock.now += 60  # a quiet minute refills the bucket, to its size and no more
    waits = [lim.acquire() for _ in range(4)]
    assert waits == pytest.approx([0, 0, 0, 0.1])


def test_tokens_are_handed_out_once_across_threads() -> None:
    """Sixteen threads at once (the clock stands still: every sleep is only recorded):
    the burst goes at once, every other call gets a slot of its own."""
    clock = Clock()
    clock.sleep = clock.slept.append  # type: ignore[method-assign,assignment]
    lim = limits(clock, qps=10, burst=4)
    start = threading.Barrier(16)

    def call() -> None:
        start.wait()
        lim.acquire()

    threads = [threading.Thread(target=call) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(clock.slept) == pytest.approx([0.1 * k for k in range(1, 13)])


def test_a_retry_after_holds_every_new_call_then_they_go_at_qps_without_a_burst() -> None:
    clock = Clock()
    lim = limits(clock, qps=10, burst=3)
    assert lim.throttled(2.0) == 2.0
    waits = [lim.acquire() for _ in range(3)]
    # the first after the hold goes as it ends; the bucket did not fill during it
    assert waits == pytest.approx([2.0, 0.1, 0.1])


def test_a_call_waiting_for_its_token_when_a_429_comes_waits_out_the_hold() -> None:
    clock = Clock()
    lim = limits(clock, qps=1, burst=1)
    lim.acquire()
    clock.on_sleep.append(lambda: lim.throttled(5.0))  # another call met a 429 meanwhile
    waited = lim.acquire()
    # its token was due in 1 s, but the server asked for 5 s from then
    assert waited == pytest.approx(6.0)
    assert clock.now == pytest.approx(1006.0)


def test_the_hold_is_capped_and_a_429_without_retry_after_holds_a_second() -> None:
    clock = Clock()
    lim = limits(clock)
    assert lim.throttled(3600) == RETRY_AFTER_CAP_S
    clock.now += RETRY_AFTER_CAP_S
    assert lim.throttled(None) == 1.0
    assert lim.acquire() == pytest.approx(1.0)


def test_a_throttling_episode_is_logged_once_and_its_end_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    lim = limits(clock)
    with caplog.at_level(logging.INFO, logger="raysize.activities"):
        for _ in range(5):
            lim.throttled(2.0)
        lim.answered()  # an answer while the hold runs (a call sent before it) ends nothing
        assert lim.throttling
        clock.now += 2.0
        lim.answered()
        lim.answered()
        lim.throttled(1.0)  # a new episode
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0].startswith("the Kubernetes API server at https://api:6443 is throttling")
    assert "429 Too Many Requests" in lines[0] and "Retry-After: 2 s" in lines[0]
    assert "API Priority and Fairness" in lines[0]
    assert lines[1].startswith("the Kubernetes API server at https://api:6443 takes raysize")
    assert "5 turned away with 429 over 2.0 s" in lines[1]
    assert "is throttling" in lines[2]


def acquired(
    caplog: pytest.LogCaptureFixture,
    lim: KubeLimits,
    calls: int,
    clock: Clock | None = None,
    gap_s: float = 0.0,
) -> list[str]:
    """`calls` tokens taken one after another (`gap_s` of `clock` between them): every
    WARNING logged so far."""
    with caplog.at_level(logging.WARNING, logger="raysize.activities"):
        for _ in range(calls):
            lim.acquire()
            if clock is not None:
                clock.now += gap_s
    return [r.getMessage() for r in caplog.records]


def test_a_long_wait_for_the_clients_own_limit_is_logged_at_most_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lines = acquired(caplog, limits(Clock(), qps=0.5, burst=1), 4)  # each waits 2 s
    assert len(lines) == 1
    assert "raysize's own rate limit (RAYSIZE_KUBE_QPS=0.5, RAYSIZE_KUBE_BURST=1)" in lines[0]


def test_a_limit_that_sets_the_pace_is_logged_though_no_call_waits_long(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each call waits a tenth of a second (never LONG_WAIT_S), as behind the worker's
    few threads, yet every call goes at the limit's pace: said once a minute."""
    lim = limits(Clock(), qps=10, burst=3)
    lines = acquired(caplog, lim, 300)  # 30 s at 10 a second
    assert len(lines) == 1, lines  # and no call waited long
    assert "set the pace" in lines[0]
    assert "at https://api:6443: 103 requests in the last 10 s (10 a second" in lines[0]
    assert "RAYSIZE_KUBE_QPS=10, RAYSIZE_KUBE_BURST=3), 100 of them held" in lines[0]
    assert "raise RAYSIZE_KUBE_QPS and RAYSIZE_KUBE_BURST if the server has room" in lines[0]
    lines = acquired(caplog, lim, 500)  # 50 s more: a minute after the first line
    assert len(lines) == 2 and "set the pace" in lines[1]


def test_calls_below_the_limit_or_held_by_the_server_are_not_the_limits_pace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    lim = limits(clock, qps=10, burst=3)
    assert acquired(caplog, lim, 300, clock, gap_s=0.125) == []  # 8 a second for 37.5 s: none waits
    with caplog.at_level(logging.WARNING, logger="raysize.activities"):
        for _ in range(30):  # the server's Retry-After holds every call 2 s
            lim.throttled(2.0)
            lim.acquire()
    assert not [r for r in caplog.records if "set the pace" in r.getMessage()]
    assert clock.slept and all(s == 2.0 for s in clock.slept)


def test_errors_and_waits_are_counted_by_kind_on_the_workers_meter() -> None:
    buffer = MetricBuffer(1000)
    runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
    clock = Clock()
    lim = limits(clock, qps=10, burst=1, meter=runtime.metric_meter)
    lim.throttled(1.0)
    lim.throttled(1.0)
    lim.count_error("unavailable")
    lim.acquire()  # held by the server
    lim.acquire()  # a token later
    counts: dict[tuple[str, str], float] = defaultdict(float)
    for u in buffer.retrieve_updates():
        if u.metric.kind == BUFFERED_METRIC_KIND_COUNTER:
            for key in ("kind", "reason"):
                if key in u.attributes:
                    counts[(u.metric.name, str(u.attributes[key]))] += u.value
    assert counts == {
        (KUBE_API_ERRORS, "throttled"): 2,
        (KUBE_API_ERRORS, "unavailable"): 1,
        (KUBE_CLIENT_WAITS, "retry-after"): 1,
        (KUBE_CLIENT_WAITS, "qps"): 1,
    }


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"Retry-After": "3"}, 3.0),
        ({"retry-after": " 1.5 "}, 1.5),
        ({"Retry-After": "0"}, 0.0),
        ({"Retry-After": "-1"}, None),
        ({"Retry-After": "soon"}, None),
        ({"Retry-After": "nan"}, None),
        ({"Retry-After": ""}, None),
        ({}, None),
        (None, None),
        (
            {
                "Retry-After": format_datetime(
                    datetime(2030, 1, 1, 0, 0, 7, tzinfo=UTC), usegmt=True
                )
            },
            7.0,
        ),
    ],
)
def test_retry_after_is_read_from_seconds_or_a_date(headers: object, seconds: float | None) -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC).timestamp()
    assert retry_after_of(headers, now=lambda: now) == seconds  # type: ignore[arg-type]


@pytest.mark.parametrize(("qps", "burst"), [(0, 1), (-1, 1), (float("inf"), 1), (1, 0), (1, 1.5)])
def test_limits_that_cannot_work_are_refused(qps: float, burst: int) -> None:
    with pytest.raises(ValueError):
        check_limits(qps, burst)


def _api_exception(status: int, body: str, headers: dict[str, str]) -> ApiException:
    exc = ApiException(status=status, reason="Too Many Requests")
    exc.body, exc.headers = body, headers
    return exc


def test_a_429_is_throttled_with_the_servers_retry_after_not_unavailable() -> None:
    err = from_api_exception(
        _api_exception(429, APF_BODY, {"Retry-After": "7"}), kind="Pod", server="https://api:6443"
    )
    assert isinstance(err, Throttled) and isinstance(err, Unavailable)  # retried as before
    assert err.retry_after == 7.0 and err.retryable
    assert error_kind(err) == "throttled"
    text = str(err)
    assert text.startswith("the Kubernetes API server at https://api:6443 is throttling raysize")
    assert "429 Too Many Requests" in text and "API Priority and Fairness" in text
    assert "called again in 7 s (Retry-After)" in text
    assert "Too many requests, please try again later." in text
    app = err.to_application_error()
    assert app.type == "KubernetesThrottled" and not app.non_retryable
    assert app.next_retry_delay == timedelta(seconds=7)


def test_a_long_retry_after_is_capped_and_none_leaves_temporals_policy() -> None:
    long = from_api_exception(_api_exception(429, APF_BODY, {"Retry-After": "600"}))
    assert long.to_application_error().next_retry_delay == timedelta(seconds=RETRY_AFTER_CAP_S)
    bare = from_api_exception(_api_exception(429, APF_BODY, {}))
    assert isinstance(bare, Throttled) and bare.retry_after is None
    assert "it gave no Retry-After" in str(bare)
    assert bare.to_application_error().next_retry_delay is None


def test_a_429_status_body_gives_its_retry_after_seconds() -> None:
    """Other 429s than APF's are a Status (`NewTooManyRequests`) with retryAfterSeconds."""
    body = (
        '{"kind":"Status","status":"Failure","message":"storage is (re)initializing",'
        '"reason":"TooManyRequests","details":{"retryAfterSeconds":2},"code":429}'
    )
    err = from_api_exception(_api_exception(429, body, {}))
    assert isinstance(err, Throttled) and err.retry_after == 2.0
    assert "storage is (re)initializing" in str(err)


@pytest.mark.parametrize(
    ("status", "kind"), [(500, "unavailable"), (503, "unavailable"), (0, "unreachable")]
)
def test_5xx_and_no_answer_stay_unavailable_and_are_told_apart(status: int, kind: str) -> None:
    err = from_api_exception(_api_exception(status, "", {"Retry-After": "1"}))
    assert type(err) is Unavailable and error_kind(err) == kind
    assert err.to_application_error().type == "KubernetesUnavailable"
