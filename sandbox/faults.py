"""Fault injection: errors, latency and watch disconnects, per verb and resource.

A rule matches a request by verb (`get`, `list`, `watch`, `create`, `update`, `patch`,
`delete`, or `*`) and resource (`pods`, `pods/resize`, `pods/status`, `rayclusters`,
... or `*`). Rules are checked in order; the first match decides. Randomness comes from
a seeded generator so a failing reliability test can be replayed.
"""

from __future__ import annotations

import math
import random
import threading
from dataclasses import dataclass, field

from raysize.sandbox.errors import ApiError, conflict, internal_error, too_many_requests

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "*")
ERROR_CODES = (409, 429, 500)


@dataclass
class FaultRule:
    verb: str = "*"
    resource: str = "*"
    error_rate: float = 0.0
    codes: tuple[int, ...] = (500,)
    latency_s: float = 0.0
    watch_disconnect_after_s: float | None = None
    # the fault proxy (sandbox/faultproxy.py) forwards a watch's stream for this long, then
    # nothing more, and keeps the connection open: a connection an idle load balancer or
    # NAT dropped without closing it (the embedded server itself does not stall)
    watch_stall_after_s: float | None = None
    times: int | None = None  # inject at most this many errors, then stop
    retry_after_s: int = 1  # a 429's Retry-After (kube-apiserver's APF asks 1 to 32 s)
    injected: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        if self.verb not in VERBS:
            raise ValueError(f"fault verb {self.verb!r}: expected one of {', '.join(VERBS)}")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"fault error_rate {self.error_rate}: expected 0..1")
        bad = [c for c in self.codes if c not in ERROR_CODES]
        if bad:
            raise ValueError(f"fault codes {bad}: expected some of {ERROR_CODES}")
        if self.latency_s < 0:
            raise ValueError(f"fault latency_s {self.latency_s}: expected >= 0")
        if self.retry_after_s < 0:
            raise ValueError(f"fault retry_after_s {self.retry_after_s}: expected >= 0")

    def matches(self, verb: str, resource: str) -> bool:
        return self.verb in ("*", verb) and (
            self.resource == "*"
            or self.resource == resource
            or (self.resource.endswith("/*") and resource.startswith(self.resource[:-1]))
        )

    def to_json(self) -> dict[str, object]:
        return {
            "verb": self.verb,
            "resource": self.resource,
            "error_rate": self.error_rate,
            "codes": list(self.codes),
            "latency_s": self.latency_s,
            "watch_disconnect_after_s": self.watch_disconnect_after_s,
            "watch_stall_after_s": self.watch_stall_after_s,
            "times": self.times,
            "retry_after_s": self.retry_after_s,
            "injected": self.injected,
        }


FAULT_KEYS = ("verb", "resource", "status", "rate", "latency", "disconnect", "times")
FAULT_SYNTAX = (
    "expected comma-separated key=value with keys verb, resource, status (409, 429 or 500; "
    "several as 409|500), rate (0..1), latency (s), disconnect (s), times, "
    "e.g. 'verb=patch,resource=pods/resize,status=409,rate=0.1'"
)


def parse_fault(text: str) -> FaultRule:
    """A rule from `verb=patch,resource=pods/resize,status=409,rate=0.1` (the CLI's
    `--fault`). Raises ValueError with a one-line reason."""
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ValueError(f"{part.strip()!r} is not key=value; {FAULT_SYNTAX}")
        if key not in FAULT_KEYS:
            raise ValueError(f"unknown key {key!r}; {FAULT_SYNTAX}")
        if key in fields:
            raise ValueError(f"{key!r} given twice")
        fields[key] = value

    def number(key: str, kind: type[float] | type[int]) -> float | int | None:
        if key not in fields:
            return None
        try:
            value = kind(fields[key])
        except ValueError:
            value = None
        if value is None or not math.isfinite(value):
            what = "an integer" if kind is int else "a finite number"
            raise ValueError(f"{key}={fields[key]!r} is not {what}")
        return value

    rate, latency = number("rate", float), number("latency", float)
    disconnect, times = number("disconnect", float), number("times", int)
    codes: tuple[int, ...] = (500,)
    if "status" in fields:
        try:
            codes = tuple(int(c) for c in fields["status"].split("|"))
        except ValueError:
            raise ValueError(f"status={fields['status']!r}: expected codes like 409|500") from None
    if times is not None and times < 1:
        raise ValueError(f"times={times}: expected at least 1")
    if disconnect is not None and disconnect <= 0:
        raise ValueError(f"disconnect={disconnect}: expected > 0 seconds")
    if "status" in fields and rate is None:
        rate = 1.0  # a status alone: every matching request fails
    rule = FaultRule(
        verb=fields.get("verb", "*"),
        resource=fields.get("resource", "*"),
        error_rate=float(rate or 0.0),
        codes=codes,
        latency_s=float(latency or 0.0),
        watch_disconnect_after_s=None if disconnect is None else float(disconnect),
        times=None if times is None else int(times),
    )
    if not (rule.error_rate or rule.latency_s or rule.watch_disconnect_after_s):
        raise ValueError("the rule does nothing: give rate/status, latency or disconnect")
    return rule


def describe(rule: FaultRule) -> str:
    """One line for people: `patch pods/resize: 409 for 10% of requests`."""
    parts = []
    if rule.error_rate:
        codes = "|".join(str(c) for c in rule.codes)
        parts.append(f"{codes} for {rule.error_rate:.0%} of requests")
        if rule.times is not None:
            parts[-1] += f" (at most {rule.times})"
    if rule.latency_s:
        parts.append(f"{rule.latency_s:g} s latency")
    if rule.watch_disconnect_after_s:
        parts.append(f"watches cut after {rule.watch_disconnect_after_s:g} s")
    if rule.watch_stall_after_s is not None:
        parts.append(f"watches silent after {rule.watch_stall_after_s:g} s")
    return f"{rule.verb} {rule.resource}: {', '.join(parts)}"


@dataclass
class Decision:
    latency_s: float = 0.0
    error: ApiError | None = None
    watch_disconnect_after_s: float | None = None
    watch_stall_after_s: float | None = None


class Faults:
    def __init__(self, seed: int = 0) -> None:
        self._rules: list[FaultRule] = []
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self.injected_errors = 0

    def add(self, rule: FaultRule) -> FaultRule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def remove(self, rule: FaultRule) -> None:
        """Take one rule away (the others stay)."""
        with self._lock:
            self._rules = [r for r in self._rules if r is not rule]

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def rules(self) -> list[FaultRule]:
        with self._lock:
            return list(self._rules)

    def decide(self, verb: str, resource: str, name: str) -> Decision:
        with self._lock:
            if not self._rules:
                return Decision()
            for rule in self._rules:
                if not rule.matches(verb, resource):
                    continue
                if rule.times is not None and rule.injected >= rule.times:
                    continue  # used up: the rules after it apply
                decision = Decision(
                    rule.latency_s, None, rule.watch_disconnect_after_s, rule.watch_stall_after_s
                )
                if rule.error_rate and self._random.random() < rule.error_rate:
                    rule.injected += 1
                    self.injected_errors += 1
                    code = self._random.choice(rule.codes)
                    decision.error = _error(code, resource, name, rule.retry_after_s)
                return decision
            return Decision()


def _error(code: int, resource: str, name: str, retry_after_s: int = 1) -> ApiError:
    if code == 409:
        base = resource.split("/")[0]
        return conflict(base, name or "unknown", "ray.io" if base == "rayclusters" else "")
    if code == 429:
        return too_many_requests(retry_after_s)
    return internal_error()
