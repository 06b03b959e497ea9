"""Fault injection: errors, latency and watch disconnects, per verb and resource.

A rule matches a request by verb (`get`, `list`, `watch`, `create`, `update`, `patch`,
`delete`, or `*`) and resource (`pods`, `pods/resize`, `pods/status`, `rayclusters`,
... or `*`). Rules are checked in order; the first match decides. Randomness comes from
a seeded generator so a failing reliability test can be replayed.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

from sandbox.errors import ApiError, conflict, internal_error, too_many_requests

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
    times: int | None = None  # inject at most this many errors, then stop
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
            "times": self.times,
            "injected": self.injected,
        }


@dataclass
class Decision:
    latency_s: float = 0.0
    error: ApiError | None = None
    watch_disconnect_after_s: float | None = None


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
                decision = Decision(rule.latency_s, None, rule.watch_disconnect_after_s)
                if rule.error_rate and self._random.random() < rule.error_rate:
                    rule.injected += 1
                    self.injected_errors += 1
                    code = self._random.choice(rule.codes)
                    decision.error = _error(code, resource, name)
                return decision
            return Decision()


def _error(code: int, resource: str, name: str) -> ApiError:
    if code == 409:
        base = resource.split("/")[0]
        return conflict(base, name or "unknown", "ray.io" if base == "rayclusters" else "")
    if code == 429:
        return too_many_requests(1)
    return internal_error()
