"""`bench.scale_bench`'s pure parts: its arguments, the figures it reads from a reconcile
history and its verdicts (the run itself needs the real control plane: not in the suite)."""

from __future__ import annotations

import json

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

from bench.histories import LOCAL_ACTIVITY_MARKER
from bench.scale_bench import MAX_TICK_BYTES, Memory, TickFigures, parse_args, report, tick_figures
from raysize.workflows.contracts import Act


class History:
    """A reconcile history, event by event, at given seconds."""

    def __init__(self) -> None:
        self.events: list[HistoryEvent] = []

    def _add(self, at: float, kind: EventType.ValueType) -> HistoryEvent:
        e = HistoryEvent(event_id=len(self.events) + 1, event_type=kind)
        e.event_time.FromMicroseconds(int(at * 1e6))
        self.events.append(e)
        return e

    def task(self, scheduled: float, started: float, completed: float) -> None:
        """A workflow task."""
        self._add(scheduled, EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED)
        self._add(started, EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED)
        self._add(completed, EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)

    def local(self, at: float, name: str, result: object = None) -> None:
        """A local activity's marker, recorded with the task just completed (`result`
        None: it failed)."""
        e = self._add(at, EventType.EVENT_TYPE_MARKER_RECORDED)
        marker = e.marker_recorded_event_attributes
        marker.marker_name = LOCAL_ACTIVITY_MARKER
        data = json.dumps({"seq": 1, "activity_type": name}).encode()
        marker.details["data"].payloads.append(Payload(data=data))
        if result is None:
            marker.failure.message = "list pods: timed out"
        else:
            marker.details["result"].payloads.append(Payload(data=json.dumps(result).encode()))

    def scheduled(self, at: float, name: str) -> int:
        e = self._add(at, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
        e.activity_task_scheduled_event_attributes.activity_type.name = name
        return e.event_id

    def completed(self, at: float, sid: int) -> None:
        e = self._add(at, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
        e.activity_task_completed_event_attributes.scheduled_event_id = sid

    def child(self, at: float) -> None:
        self._add(at, EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED)


def busy_then_quiet() -> History:
    h = History()
    # tick 1: observe 0.3 s (plan 0.1 s) in a task queued 0.2 s, a resize saga, a drain,
    # an Event and a scale, then the wait
    h.task(100.0, 100.2, 100.5)
    plan = {"resize": [{"pod": "p1"}], "terminate": [{"pod": "p2"}], "launch": []}
    h.local(100.5, Act.OBSERVE, {"plan_s": 0.1, "plan": plan})
    h.child(100.5)
    drain = h.scheduled(100.5, Act.DRAIN)
    h.task(100.55, 100.55, 100.6)  # the saga started
    h.completed(100.8, drain)
    h.task(100.8, 100.8, 100.85)
    h.local(100.85, Act.EVENT, None)
    scale = h.scheduled(100.85, Act.SCALE)
    h.completed(101.15, scale)
    h.task(101.15, 101.15, 101.2)
    wait = h.scheduled(101.2, Act.WAIT_FOR_CHANGE)
    h.completed(130.0, wait)  # the wait's own time is no part of the tick
    # tick 2: quiet
    h.task(130.0, 130.1, 130.3)
    h.local(130.3, Act.OBSERVE, {"plan_s": 0.05, "plan": {}})
    h.scheduled(130.3, Act.WAIT_FOR_CHANGE)
    # tick 3 began: not over, left out
    h.task(140.0, 140.0, 140.1)
    h.local(140.1, Act.OBSERVE, {"plan_s": 0.05, "plan": {}})
    return h


def test_tick_figures_read_observe_plan_act_and_bytes_from_the_history() -> None:
    h = busy_then_quiet()
    busy, quiet = tick_figures(h.events)
    assert busy.observe_s == pytest.approx(0.3)
    assert busy.queued_s == pytest.approx(0.2)
    assert quiet.queued_s == pytest.approx(0.1)
    assert busy.plan_s == pytest.approx(0.1)
    assert busy.act_s == pytest.approx(0.7)  # the observing task completed → the wait scheduled
    assert busy.tick_s == pytest.approx(1.0)
    assert busy.acts == {Act.DRAIN: pytest.approx(0.3), Act.SCALE: pytest.approx(0.3)}
    assert (busy.resizes, busy.terminates, busy.launches, busy.sagas) == (1, 1, 0, 1)
    assert busy.busy and not quiet.busy
    assert quiet.tick_s == pytest.approx(0.2)
    # every event of a tick counted once, the unfinished tick's not at all
    sizes = [len(e.SerializeToString()) for e in h.events]
    assert busy.bytes + quiet.bytes == sum(sizes[:-4])


def test_a_failed_observe_is_no_tick() -> None:
    h = History()
    h.task(1.0, 1.0, 1.1)
    h.local(1.1, Act.OBSERVE, None)  # failed
    h.task(5.0, 5.0, 5.1)
    h.local(5.1, Act.OBSERVE, {"plan_s": 0.05, "plan": {}})
    assert tick_figures(h.events) == []


def tick(tick_s: float, nbytes: int, *, busy: bool) -> TickFigures:
    return TickFigures(
        observe_s=tick_s / 2,
        queued_s=0.0,
        plan_s=0.01,
        act_s=tick_s / 2,
        bytes=nbytes,
        resizes=int(busy),
    )


def test_the_report_judges_each_figure_against_its_target() -> None:
    memory = Memory(peak_mib=300, steady_mib=250, empty_mib=150)
    first = tick(9.0, 10**6, busy=False)  # the watch's first list: shown, not judged
    ticks = [first, tick(0.5, 9000, busy=False), tick(1.5, 30_000, busy=True)]
    lines, ok = report(5000, ticks, memory)
    assert ok, lines
    assert "not judged" in lines[0]
    assert sum("met" in line for line in lines) == 5
    # 100 MiB over 5,000 pods
    assert "20.5 KiB per pod" in lines[-1]

    slow = [first, tick(0.5, 9000, busy=False), tick(2.5, MAX_TICK_BYTES + 1, busy=True)]
    lines, ok = report(5000, slow, memory)
    assert not ok
    assert [line.split(":")[0] for line in lines if "MISSED" in line] == [
        "busy ticks (1)",
        "busy ticks",
    ]
    fat = Memory(peak_mib=700, steady_mib=250, empty_mib=150)
    lines, ok = report(5000, ticks, fat)
    assert not ok and "MISSED" in lines[-1]
    lines, ok = report(5000, [first, tick(0.5, 9000, busy=False)], memory)
    assert not ok and "busy ticks: none measured MISSED" in lines


def test_arguments() -> None:
    args = parse_args([])
    assert (args.pods, args.quiet_ticks, args.grow, args.remove) == (5000, 3, 10, 10)
    assert parse_args(["--pods", "500"]).pods == 500


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--pods", "0"], "--pods"),
        (["--quiet-ticks", "0"], "--quiet-ticks"),
        (["--grow", "0", "--remove", "0"], "--grow and --remove"),
        (["--pods", "5", "--grow", "3", "--remove", "3"], "is over --pods"),
    ],
)
def test_bad_arguments_are_refused_by_name(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert says in capsys.readouterr().err
