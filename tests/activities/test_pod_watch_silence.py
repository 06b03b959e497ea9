"""The pod watch's bound on silence, and a read's LIST taken into its cache (issue #43
item 2), with an injected clock and no server: the watch's state is set as its thread
leaves it after a list and a connect. Both worlds run the same through a stalled proxy in
tests/sandbox/test_stale_watch.py."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from raysize.activities.pod_watch import CLUSTER_LABEL, STALE_SLACK_S, WATCH_TIMEOUT_S, PodWatch

NS, CLUSTER = "ns", "c"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def record(name: str, version: str, uid: str = "u1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": uid,
            "resourceVersion": version,
            "labels": {CLUSTER_LABEL: CLUSTER},
        }
    }


def listed_and_connected(clock: Clock, *records: dict[str, Any]) -> tuple[PodWatch, dict]:
    """A watch as its thread leaves it: listed (`records`), connected, heard from now."""
    watch = PodWatch(None, clock=clock)
    known = {r["metadata"]["name"]: r for r in records}
    with watch._lock:
        watch._pods[NS] = known
        for name, r in known.items():
            watch._index(NS, name, None, r)
        watch._synced.add(NS)
        watch._hear(NS)
    return watch, known


def versions(watch: PodWatch) -> dict[str, str]:
    return {
        n: r["metadata"]["resourceVersion"] for n, r in watch._by_cluster[(NS, CLUSTER)].items()
    }


def event(watch: PodWatch, known: dict, kind: str, r: dict[str, Any]) -> None:
    """The watch thread's delivery of one event into the cache."""
    with watch._lock:
        watch._apply_event(NS, kind, r["metadata"], r, known, True)


def test_a_watch_silent_past_its_bound_is_not_synced(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    watch, _ = listed_and_connected(clock)
    # a short server-side timeout, and a bound a little past it
    assert (watch.timeout_s, watch.stale_after_s) == (30, 30 + STALE_SLACK_S)
    assert WATCH_TIMEOUT_S == 30
    clock.now += watch.stale_after_s
    assert watch.synced(NS)
    clock.now += 0.1
    with caplog.at_level(logging.WARNING, logger="raysize.activities"):
        assert not watch.synced(NS)
        assert not watch.synced(NS)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "nothing heard for 45 s" in said[0], said
    with watch._lock:
        watch._hear(NS)  # an event, a bookmark or a new connection
    assert watch.synced(NS)


def test_a_reads_list_refreshes_the_cache_and_the_watch_never_takes_it_back() -> None:
    clock = Clock()
    watch, known = listed_and_connected(clock, record("w", "1"), record("x", "1", uid="ux"))
    since = watch.list_mark(NS)
    # the read's LIST: w at version 3, x gone, y new
    watch.listed(NS, CLUSTER, [record("w", "3"), record("y", "1", uid="uy")], since)
    assert versions(watch) == {"w": "3", "y": "1"}
    assert watch.refreshed == 3
    assert watch.cluster_pods_mark(NS, CLUSTER) is not None

    # the lagging watch then delivers what the LIST has seen past: not taken
    event(watch, known, "MODIFIED", record("w", "2"))
    event(watch, known, "MODIFIED", record("x", "2", uid="ux"))
    assert versions(watch) == {"w": "3", "y": "1"}
    # until it gets to the LIST's version (or the deletion): from there, as before
    event(watch, known, "MODIFIED", record("w", "3"))
    event(watch, known, "MODIFIED", record("w", "4"))
    event(watch, known, "DELETED", record("x", "3", uid="ux"))
    assert versions(watch) == {"w": "4", "y": "1"}
    # a pod created again under the name is another pod: taken at once
    event(watch, known, "ADDED", record("x", "9", uid="ux2"))
    assert versions(watch) == {"w": "4", "x": "9", "y": "1"}


def test_a_reads_list_leaves_what_the_watch_delivered_meanwhile() -> None:
    clock = Clock()
    watch, known = listed_and_connected(clock, record("w", "1"), record("v", "1"))
    since = watch.list_mark(NS)
    event(watch, known, "MODIFIED", record("w", "5"))  # during the LIST
    watch.listed(NS, CLUSTER, [record("w", "4"), record("v", "2")], since)
    assert versions(watch) == {"w": "5", "v": "2"}
    # and after the watch listed again, an older read's LIST is not taken at all
    with watch._lock:
        watch._seq += 1
        watch._relisted[NS] = watch._seq
    watch.listed(NS, CLUSTER, [record("w", "0"), record("v", "0")], since)
    assert versions(watch) == {"w": "5", "v": "2"}


def test_the_marks_of_deletions_go_once_no_read_can_need_them() -> None:
    """Issue #43 item 6b: each deleted pod left a mark (for a read's LIST that began before
    the deletion) until 16,384 had piled up. A LIST ends long before GONE_KEPT_S."""
    from raysize.activities.pod_watch import GONE_KEPT_S

    clock = Clock()
    watch, known = listed_and_connected(clock, record("a", "1"), record("b", "1"))
    event(watch, known, "DELETED", record("a", "2"))
    assert list(watch._gone_at) == [(NS, "a")]
    clock.now += GONE_KEPT_S + 1
    event(watch, known, "DELETED", record("b", "2"))
    assert list(watch._gone_at) == [(NS, "b")]
