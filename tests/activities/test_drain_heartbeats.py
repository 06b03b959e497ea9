"""`drain_raylets` heartbeats while it drains (issue #43 item 4), whatever one GCS call
holds it: its workflow gives it a heartbeat timeout (`HEARTBEAT_TIMEOUT`, 15 s), so a
worker that dies mid-drain is noticed in seconds, and a drain that merely takes long (a
slow GCS, hundreds of Raylets) must not be taken for a dead one.

`tests/orchestration/test_drain_heartbeat.py` shows the other half: the loop drains again
within the heartbeat timeout when an attempt goes silent."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from raysize.activities import cluster as cluster_module
from raysize.activities.cluster import ClusterActivities
from raysize.activities.ray_gcs import DrainReply
from raysize.workflows.contracts import DrainInput, DrainTarget
from tests.activities.test_observe_only_guard import RecordingKube

BEATS = 3  # heartbeats the slow call waits for before it answers
BOUND_S = 10.0  # a drain that never beats fails after this (never reached when it beats)


class SlowGcs:
    """A GCS whose drain answers only once the activity has heartbeaten `BEATS` times
    (a call held that long: the drain must go on beating meanwhile)."""

    def __init__(self, beaten: threading.Event) -> None:
        self.beaten = beaten
        self.asked: list[str] = []

    def drain_node(self, node_id: str, reason: str) -> DrainReply:
        self.asked.append(node_id)
        if not self.beaten.wait(BOUND_S):
            return DrainReply(accepted=False, rejection="the drain never heartbeat")
        return DrainReply(accepted=True)


def test_a_drain_heartbeats_while_a_gcs_call_holds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # the beat's pace, shortened: 5 s in the worker (a third of the heartbeat timeout)
    monkeypatch.setattr(cluster_module, "DRAIN_HEARTBEAT_EVERY_S", 0.01, raising=False)
    beats: list[Any] = []
    beaten = threading.Event()

    def on_heartbeat(*details: Any) -> None:
        beats.append(details)
        if len(beats) >= BEATS:
            beaten.set()

    acts = ClusterActivities(kube=RecordingKube())
    gcs = SlowGcs(beaten)
    acts.gcs = lambda address, source=None, cluster=None: gcs  # type: ignore[method-assign,assignment,return-value]
    acts._sources[("ns", "c")] = None  # the worker's own Ray token (as an observe found)
    env = ActivityEnvironment()
    env.on_heartbeat = on_heartbeat
    inp = DrainInput(
        namespace="ns",
        cluster="c",
        gcs_address="127.0.0.1:1",
        targets=(DrainTarget(pod="p", node_id="ab" * 28, reason="raysize: idle"),),
    )
    try:
        result = asyncio.run(env.run(acts.drain_raylets, inp))
    finally:
        acts.targets.close()
    assert gcs.asked == ["ab" * 28]
    assert result.accepted == ("p",), result.refused
    assert len(beats) >= BEATS
