"""`bench.tick_record_bench`: a tick of a 10,000-pod idle cluster keeps every record it
makes under 512 KB (issue #43 item 4: 10,000 removals made a 2.2 MB tick, over Temporal's
2 MB payload limit). Sizes only: no timing is asserted."""

from __future__ import annotations

import pytest

from bench.tick_record_bench import MAX_RECORD_BYTES, main, tick_records
from raysize.workflows.contracts import MAX_REMOVALS_PER_TICK


def test_a_10000_pod_idle_cluster_s_tick_records_stay_under_512_kb() -> None:
    records = tick_records(10_000)
    assert records.largest <= MAX_RECORD_BYTES, records.line()
    # the removals are capped, not dropped: the rest are left to the next ticks
    assert records.removals == MAX_REMOVALS_PER_TICK
    assert records.planned_out == 10_000 - MAX_REMOVALS_PER_TICK


def test_the_command_prints_each_size_and_says_met(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--sizes", "600"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("pods=600 removals=500 left_for_later=100 ") and line.endswith(" met")
