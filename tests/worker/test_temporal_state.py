"""The readiness probe's reading of the worker's Temporal state (worker/health.py): a
refusal fails `ready` at once, an outage only past `--max-unreachable`, and a file it
cannot read decides nothing (the other checks do)."""

from __future__ import annotations

from pathlib import Path

from raysize.worker import health


def test_refused_fails_at_once_unreachable_only_when_long(tmp_path: Path) -> None:
    beat = tmp_path / "heartbeat"
    state = health.temporal_state_path(beat)
    assert state == tmp_path / "heartbeat.temporal"
    assert health.check_temporal_state(state, 60) is None  # nothing recorded yet
    health.write_temporal_state(state, health.STATE_OK, 1000.0)
    assert health.check_temporal_state(state, 60, now=5000.0) is None
    health.write_temporal_state(state, health.STATE_REFUSED, 1000.0, "RAYSIZE_X: refused")
    assert health.check_temporal_state(state, 60, now=1000.0) == "RAYSIZE_X: refused"
    health.write_temporal_state(state, health.STATE_UNREACHABLE, 1000.0, "cannot reach")
    assert health.check_temporal_state(state, 60, now=1060.0) is None
    assert health.check_temporal_state(state, 60, now=1061.0) == (
        "cannot reach (for 61s, more than 60s)"
    )
    state.write_text("{not json")
    assert health.check_temporal_state(state, 60) is None
    # live never reads it
    health.write_temporal_state(state, health.STATE_REFUSED, 1000.0, "refused")
    env = {health.HEALTH_FILE_ENV: str(beat)}
    health.beat(beat)
    assert health.main(["live"], env) == 0
