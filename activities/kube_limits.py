"""How hard raysize presses on one Kubernetes API server: `KubeLimits`.

As client-go's clients do, every request raysize sends takes a token from a bucket first
(QPS and burst: `RAYSIZE_KUBE_QPS`, `RAYSIZE_KUBE_BURST`). `acquire` blocks the calling
thread until its token is due: `Kube`'s calls run in threads (`asyncio.to_thread`), never
on the event loop. A watch takes a token when it lists and when it (re)connects, not per
event.

When the server turns a request away with 429 Too Many Requests (its API Priority and
Fairness, or `--max-requests-inflight`) and a `Retry-After`, `throttled` holds every new
call to that server until that time has passed, and lets them go after it at QPS, with no
burst: the loops of all clusters back off together from one throttling server, instead of
each one meeting its own 429. The throttling is logged once per episode (its start, and
its end at the first answer after the hold), not per call; `raysize_kube_api_errors`
counts every error by kind, so 429s are told apart from 5xx and unreachable servers.

Pure bookkeeping around an injectable clock and sleep, so its timing is tested without
waiting (tests/activities/test_kube_limits.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

log = logging.getLogger("raysize.activities")

# A busy worker measured (bench.orchestration_bench, 1,000 concurrent resize sagas, one
# worker, sandbox API server, this 2-core machine under other load): 4,007 requests in
# 74 s, 54 a second on average, 84 at p90 and 111 at the busiest second. The defaults
# leave that unhindered (the busiest second spends half the burst) and stop a runaway
# loop at about twice it. client-go's own default (5 QPS, burst 10) would have made that
# burst take 13 minutes.
DEFAULT_QPS = 100.0
DEFAULT_BURST = 200
# the longest a Retry-After is honoured. kube-apiserver's APF asks 1 s to 32 s, growing
# while it keeps turning requests away: honoured in full, a 32 s ask held every call for
# 32 s after the server had room again (the APF test's recovery then passed 30 s)
RETRY_AFTER_CAP_S = 15.0
# a 429 without a Retry-After holds calls this long: the server's own shortest ask
NO_RETRY_AFTER_HOLD_S = 1.0
# a call held this long by the limiter itself (not the server) is logged, as client-go logs
# "Waited for … due to client-side throttling"; at most once per LONG_WAIT_LOG_EVERY_S
LONG_WAIT_S = 1.0
HOLD_POLL_S = 0.25  # how often a call held on the event loop looks at the hold again
LONG_WAIT_LOG_EVERY_S = 60.0
# Each call may wait only a moment for its token while the limit still sets the pace:
# with the worker's 8 threads busy, a call waits 8/QPS s (80 ms at 100 QPS) and the calls
# behind it queue for a thread, not for a token, so no call waits LONG_WAIT_S. In a
# 1,000-cluster burst the worker sent 94 requests a second for 5 minutes at
# RAYSIZE_KUBE_QPS=100 with no line saying so (`all 8 of its threads are busy` read as a
# slow server). So the limiter also looks at windows of PACE_WINDOW_S: calls sent at
# PACE_SHARE of QPS or more, with most of them held for a token, mean the limit sets the
# pace (logged at most once per LONG_WAIT_LOG_EVERY_S).
PACE_WINDOW_S = 10.0
PACE_SHARE = 0.9
_EPSILON_S = 1e-9

# metric names (recorded with the worker's metric meter, `KubeLimits.meter`)
KUBE_API_ERRORS = "raysize_kube_api_errors"  # failed Kubernetes calls, by `kind`
KUBE_CLIENT_WAITS = "raysize_kube_client_waits"  # calls the limiter held, by `reason`


def retry_after_of(
    headers: Mapping[str, Any] | None, *, now: Callable[[], float] = time.time
) -> float | None:
    """Seconds a `Retry-After` header asks to wait (delta-seconds, or an HTTP date); None
    when there is none or it is not one of those."""
    value = None
    for key, v in (headers or {}).items():
        if str(key).lower() == "retry-after":
            value = str(v).strip()
            break
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - now()
        except (TypeError, ValueError, IndexError):
            return None
        return max(0.0, seconds)
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return seconds


def check_limits(qps: float, burst: int) -> None:
    if not (isinstance(qps, int | float) and math.isfinite(qps) and qps > 0):
        raise ValueError(f"QPS {qps!r}: expected a finite number of requests a second > 0")
    if not isinstance(burst, int) or isinstance(burst, bool) or burst < 1:
        raise ValueError(f"burst {burst!r}: expected a whole number of requests >= 1")


@dataclass
class _Window:
    """Calls sent since `started`, and how many of them were held for a token."""

    started: float
    calls: int = 0
    held: int = 0


@dataclass
class _Episode:
    """The server throttling raysize: from its first 429 to the first answer after the
    last hold."""

    started: float
    rejected: int = 0
    longest_s: float = 0.0


class KubeLimits:
    """The request budget of one API server. Thread-safe; shared by every call and watch
    to that server (one `Kube`, its `PodWatch`)."""

    def __init__(
        self,
        server: str = "?",
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        meter: Any = None,
    ) -> None:
        check_limits(qps, burst)
        self.server = server
        self.qps = float(qps)
        self.burst = burst
        self._meter = meter
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._interval = 1.0 / self.qps
        # GCRA: the theoretical arrival time of the next token; a call may go once
        # `tat - tolerance` has passed (tolerance: the burst beyond the first call)
        self._tolerance = (burst - 1) * self._interval
        self._tat = clock()
        self.hold_until = clock()  # nothing goes to the server before this (Retry-After)
        self._holds = 0  # holds so far: a call that slept through a new one asks again
        self._episode: _Episode | None = None
        # when each of the limit's own lines ("long wait", "pace") was last logged
        self._logged: dict[str, float] = {}
        self._window = _Window(started=clock())  # the current pace window
        self._counters: dict[str, Any] = _counters(meter)

    @property
    def meter(self) -> Any:
        """The temporalio `MetricMeter` the counters go to (the worker's runtime's); None:
        no metrics."""
        return self._meter

    @meter.setter
    def meter(self, meter: Any) -> None:
        with self._lock:
            self._meter = meter
            self._counters = _counters(meter)

    # --- the budget -------------------------------------------------------------------------
    def acquire(self) -> float:
        """Wait (blocking this thread) until a call may go; the seconds waited."""
        waited = 0.0
        held_by_server = False
        while True:
            with self._lock:
                now = self._clock()
                holds = self._holds
                if now < self.hold_until:
                    held_by_server = True
                go = max(now, self._tat - self._tolerance, self.hold_until)
                self._tat = max(self._tat, now) + self._interval
            if go - now <= _EPSILON_S:  # float residue of the arithmetic: no wait
                break
            self._sleep(go - now)
            waited += go - now
            with self._lock:
                if self._holds == holds or self._clock() >= self.hold_until:
                    break
            # the server said "later" while this call waited for its token: a new one, after
            held_by_server = True
        if waited > 0:
            self._count(KUBE_CLIENT_WAITS, {"reason": "retry-after" if held_by_server else "qps"})
            if not held_by_server and waited >= LONG_WAIT_S:
                self._log_long_wait(waited)
        self._pace(waited > 0 and not held_by_server)
        return waited

    def _pace(self, held: bool) -> None:
        """Count a call in the pace window; at its end, say so if the limit set the pace."""
        with self._lock:
            now = self._clock()
            window = self._window
            window.calls += 1
            window.held += held
            elapsed = now - window.started
            if elapsed < PACE_WINDOW_S:
                return
            self._window = _Window(started=now)
            calls, held_calls = window.calls, window.held
            if (
                calls / elapsed < PACE_SHARE * self.qps
                or held_calls * 2 < calls
                or not self._due("pace", now)
            ):
                return
        log.warning(
            "raysize's own rate limit set the pace of its calls to the Kubernetes API at %s: "
            "%d requests in the last %.0f s (%.0f a second; RAYSIZE_KUBE_QPS=%g, "
            "RAYSIZE_KUBE_BURST=%d), %d of them held for a token. Calls queue in the worker "
            "(its threads to the server all busy), not at the server: raise "
            "RAYSIZE_KUBE_QPS and RAYSIZE_KUBE_BURST if the server has room (logged at most "
            "once a minute)",
            self.server,
            calls,
            elapsed,
            calls / elapsed,
            self.qps,
            self.burst,
            held_calls,
        )

    def _due(self, line: str, now: float) -> bool:
        """Whether `line` may be logged now (at most once per LONG_WAIT_LOG_EVERY_S), and
        if so, that it is (under the lock)."""
        if now - self._logged.get(line, -math.inf) < LONG_WAIT_LOG_EVERY_S:
            return False
        self._logged[line] = now
        return True

    def _log_long_wait(self, waited: float) -> None:
        with self._lock:
            if not self._due("long wait", self._clock()):
                return
        log.warning(
            "a call to the Kubernetes API at %s waited %.1f s for raysize's own rate limit "
            "(RAYSIZE_KUBE_QPS=%g, RAYSIZE_KUBE_BURST=%d), not for the server: raise them if the "
            "server has room (logged at most once a minute)",
            self.server,
            waited,
            self.qps,
            self.burst,
        )

    async def held(self) -> None:
        """Wait out the server's Retry-After on the event loop, before the call takes a
        thread: held in `acquire`, every call to a throttling server would sit in one of
        its few threads (activities/targets.py) for the whole hold, and the calls queued
        behind them would fail as the server unreachable without ever being sent."""
        while (left := self.hold_until - self._clock()) > 0:
            await asyncio.sleep(min(left, HOLD_POLL_S))  # a later 429 may move the end

    # --- what the server answered ------------------------------------------------------------
    def throttled(self, retry_after: float | None) -> float:
        """The server answered 429: hold every new call until `retry_after` seconds (at
        most RETRY_AFTER_CAP_S; NO_RETRY_AFTER_HOLD_S without one) have passed, then let
        them go at QPS without a burst. The seconds held."""
        hold = min(RETRY_AFTER_CAP_S, NO_RETRY_AFTER_HOLD_S if retry_after is None else retry_after)
        with self._lock:
            now = self._clock()
            self.hold_until = max(self.hold_until, now + hold)
            # the first call after the hold goes at once, the next ones a token apart
            self._tat = max(self._tat, self.hold_until + self._tolerance)
            self._holds += 1
            episode = self._episode
            starts = episode is None
            if episode is None:
                episode = self._episode = _Episode(started=now)
            episode.rejected += 1
            episode.longest_s = max(episode.longest_s, hold)
        self.count_error("throttled")
        if starts:
            log.warning(
                "the Kubernetes API server at %s is throttling raysize (429 Too Many Requests: "
                "its API Priority and Fairness, or --max-requests-inflight, turned a request "
                "away%s): every call to it waits %.3g s, then goes at most %g a second. One line "
                'per episode; raysize_kube_api_errors{kind="throttled"} counts each 429',
                self.server,
                "" if retry_after is None else f", Retry-After: {retry_after:g} s",
                hold,
                self.qps,
            )
        return hold

    def answered(self) -> None:
        """The server answered a call (anything but 429): a throttling episode whose
        hold has passed is over."""
        if self._episode is None:  # the common case, without the lock
            return
        with self._lock:
            episode, now = self._episode, self._clock()
            if episode is None or now < self.hold_until:
                return
            self._episode = None
        log.warning(
            "the Kubernetes API server at %s takes raysize's calls again: %d turned away "
            "with 429 over %.1f s (the longest hold %.3g s)",
            self.server,
            episode.rejected,
            now - episode.started,
            episode.longest_s,
        )

    @property
    def throttling(self) -> bool:
        """In a throttling episode (a 429, and no answer since its hold passed)."""
        return self._episode is not None

    def count_error(self, kind: str) -> None:
        """One failed call, by kind (`k8s_errors.error_kind`)."""
        self._count(KUBE_API_ERRORS, {"kind": kind})

    def _count(self, name: str, attrs: dict[str, str]) -> None:
        with self._lock:
            counter = self._counters.get(name)
        if counter is not None:  # no meter: no metrics
            counter.add(1, attrs)


def _counters(meter: Any) -> dict[str, Any]:
    """The limiter's counters on `meter` (none without one), each made by its name's
    constant, where tests/deploy/test_monitoring.py finds every metric raysize exports."""
    if meter is None:
        return {}
    return {
        KUBE_API_ERRORS: meter.create_counter(
            KUBE_API_ERRORS, "failed Kubernetes API calls, by kind"
        ),
        KUBE_CLIENT_WAITS: meter.create_counter(
            KUBE_CLIENT_WAITS, "Kubernetes calls raysize held back before sending them"
        ),
    }
