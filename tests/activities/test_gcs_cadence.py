"""The wait learns when a GCS publishes demands, and reads just after: a new demand is
seen within milliseconds of Ray publishing it, with one read a second instead of two.

A simulated GCS publishes the demands queued at its Raylets on a timer, as Ray 2.60's does
(measured: every 1.0004 s, ±2.3 ms); the reads follow the wait's own schedule
(`ray_read_pause`), on a simulated clock.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest

from raysize.activities.gcs_cadence import GcsCadence, Timetable, next_read_pause

READ_S = 0.001  # one read's round trip


@dataclass
class Gcs:
    """Demands submitted at `arrivals` become visible at the first publication after,
    and gone at the first publication after their task is placed (`placed`)."""

    period: float
    phase: float
    arrivals: list[float]
    jitter_s: float = 0.0
    placed: list[float] = field(default_factory=list)

    def publication(self, k: int) -> float:
        jitter = random.Random(k).uniform(-self.jitter_s, self.jitter_s)
        return self.phase + k * self.period + jitter

    def published_after(self, t: float) -> float:
        k = math.floor((t - self.phase) / self.period)
        while self.publication(k) <= t:
            k += 1
        return self.publication(k)

    def digest(self, at: float) -> int:
        """What the state built at `at` shows: demands published, and placed."""
        shown = sum(1 for a in self.arrivals if self.published_after(a) <= at)
        gone = sum(1 for p in self.placed if self.published_after(p) <= at)
        return shown * 1000 + gone


def run_wait(
    gcs: Gcs,
    cadence: GcsCadence,
    until: float,
    workers: list[GcsCadence] | None = None,
    hand_over: bool = True,
) -> tuple[list[float], list[float]]:
    """The wait's reads from 0 to `until`, a fresh wait (fast reads) after every change
    it sees; each new demand is met (its task placed) 0.3 s after it is seen. Returns,
    per arrival, how long after Ray published it the wait saw it, and when each read was
    made. `workers`: the cadences of workers that take the observe and the next wait
    after each change at random (`cadence`: the first wait's); with `hand_over`, each
    wait starts from the timetable the last one returned, as the reconcile workflow
    hands it on."""
    rng, told = random.Random(7), None
    now, started, last = 0.0, 0.0, None
    reads: list[float] = []
    seen_at: dict[int, float] = {}
    while now < until:
        digest = gcs.digest(now + READ_S / 2)
        cadence.note(digest, now, now + READ_S)
        reads.append(now)
        now += READ_S
        if last is not None and digest != last:
            shown = digest // 1000
            if shown not in seen_at and shown > last // 1000:
                seen_at[shown] = now
                gcs.placed.extend([now + 0.3] * (shown - last // 1000))
            started = now  # the reconcile observes, and the next wait reads fast again
            if workers:
                told = cadence.timetable(0.0) or told  # what the wait returns
                observer = rng.choice(workers)
                if observer is not cadence:  # the observe reads Ray's state too
                    observer.note(digest, now, now + READ_S)
                cadence = rng.choice(workers)
                if hand_over and told is not None:
                    cadence.adopt(told, to_epoch=0.0)
        last = digest
        now += next_read_pause(now - started, READ_S, now, cadence)
    delays = []
    for n, arrival in enumerate(sorted(gcs.arrivals), start=1):
        seen = min((t for d, t in seen_at.items() if d >= n), default=None)
        if seen is not None:
            delays.append(seen - gcs.published_after(arrival))
    return delays, reads


def busy_minute(seed: int) -> list[float]:
    rng = random.Random(seed)
    return sorted(rng.uniform(1, 60) for _ in range(12))


def test_a_learned_timetable_sees_each_new_demand_within_milliseconds() -> None:
    rng = random.Random(1)
    arrivals, t = [], 3.0
    while t < 300:
        arrivals.append(t)
        t += rng.uniform(4, 25)
    gcs = Gcs(period=1.0004, phase=0.37, arrivals=arrivals, jitter_s=0.002)
    delays, _ = run_wait(gcs, GcsCadence(), 310)
    assert len(delays) == len(arrivals)
    later = delays[3:]  # the first few teach it the timetable
    assert sum(later) / len(later) < 0.03, [round(d, 3) for d in later]
    assert max(later) < 0.08, [round(d, 3) for d in later]


def test_an_idle_cluster_is_read_once_a_second_once_the_timetable_is_known() -> None:
    gcs = Gcs(period=1.0004, phase=0.37, arrivals=busy_minute(4), jitter_s=0.002)
    _, reads = run_wait(gcs, GcsCadence(), 250)
    quiet = [t for t in reads if 70 <= t < 250]
    assert 0.98 <= len(quiet) / 180 <= 1.02, len(quiet) / 180
    # a GCS that never published a change is read at the steady pace
    _, reads = run_wait(Gcs(period=1.0004, phase=0.37, arrivals=[]), GcsCadence(), 130)
    assert 1.75 <= len([t for t in reads if t >= 10]) / 120 <= 1.85


def test_a_second_worker_handed_the_timetable_reads_as_well_as_the_one_that_learned_it() -> None:
    """Five demands 8–11 s apart, as the fleet benchmark's trials, on a cluster whose
    observes and waits two workers take at random: each learns only from the changes its
    own reads saw, and reads at the steady pace (a demand seen 0.28 s late on average)
    until it has. Handed the timetable the other learned, the pair does as well as one
    worker alone."""

    def delays(workers: int | None, hand_over: bool = True) -> list[float]:
        late = []
        for seed in range(20):
            rng = random.Random(seed)
            arrivals = [30.0]
            for _ in range(4):
                arrivals.append(arrivals[-1] + rng.uniform(8, 11))
            gcs = Gcs(period=1.0004, phase=rng.random(), arrivals=arrivals, jitter_s=0.002)
            cadences = [GcsCadence() for _ in range(workers or 1)]
            seen, _ = run_wait(
                gcs, cadences[0], arrivals[-1] + 5, cadences if workers else None, hand_over
            )
            assert len(seen) == len(arrivals)
            late += seen[1:]  # the first demand: nobody has learned anything yet
        return late

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    one, alone, handed = delays(None), delays(2, hand_over=False), delays(2)
    assert mean(handed) <= mean(one) + 0.01, (mean(handed), mean(one))
    assert mean(alone) > mean(one) + 0.05, (mean(alone), mean(one))
    # from the third demand on, every one is seen just after its publication
    fast = [d for k, d in enumerate(handed) if k % 4 >= 1]
    assert max(fast) < 0.08, fast


def test_a_timetable_is_taken_only_from_a_worker_that_knows_more_and_only_if_it_is_ray_s() -> None:
    learned = GcsCadence()
    for k in range(3):  # publications at k + 0.33, each seen by reads 50 ms apart
        learned.note(2 * k, k + 0.30, k + 0.301)
        learned.note(2 * k + 1, k + 0.35, k + 0.351)
    assert GcsCadence().timetable(0.0) is None
    handed = learned.timetable(to_epoch=1000.0) or pytest.fail("nothing learned")
    assert handed.confirmed == 2 and handed.windows[-1][1] - 1000 <= 2.33
    # another worker, its monotonic clock 400 s behind this one's (the epoch is shared)
    other = GcsCadence()
    assert other.adopt(handed, to_epoch=1400.0)
    near = other.next_publication(3.0 - 400)
    assert near is not None and near[0] <= 3.33 - 400 <= near[1]
    # handed back (no news), it is neither taken again nor widened
    back = other.timetable(to_epoch=1400.0) or pytest.fail("forgotten")
    assert not learned.adopt(back, to_epoch=1000.0)
    # a worker that knows less does not teach one that knows more
    one_window = GcsCadence()
    one_window.note(0, 5.30, 5.301)
    one_window.note(1, 5.35, 5.351)
    assert not other.adopt(one_window.timetable(0.0) or pytest.fail(), to_epoch=-400.0)
    assert other.next_publication(3.0 - 400) == near
    # what is not Ray's timer is refused
    assert not GcsCadence().adopt(Timetable((0.5, 0.5), handed.windows, 2), to_epoch=0.0)
    wide = ((0, 0.0, 1.0),)
    assert not GcsCadence().adopt(Timetable(handed.period, wide, 2), to_epoch=0.0)
    unordered = (handed.windows[1], handed.windows[0])
    assert not GcsCadence().adopt(Timetable(handed.period, unordered, 2), to_epoch=0.0)


def test_a_demand_after_ten_quiet_minutes_is_still_seen_quickly() -> None:
    """One busy minute, then a demand after four quiet minutes and another after ten:
    what was learned is good enough to read by; at the steady pace a demand is seen
    0.28 s late on average, 0.55 s at worst."""
    late = []
    for seed in range(1, 11):
        arrivals = [*busy_minute(seed), 300.0, 900.0]
        gcs = Gcs(period=1.0004, phase=seed / 7 % 1, arrivals=arrivals, jitter_s=0.002)
        delays, _ = run_wait(gcs, GcsCadence(), 905)
        late += delays[-2:]
    late.sort()
    assert late[len(late) // 2] < 0.15, late
    assert late[-1] < 0.4, late


@pytest.mark.parametrize("period", [0.5, 0.7, 1.25, 2.0])
def test_a_gcs_on_another_period_is_never_read_worse_than_at_the_steady_pace(
    period: float,
) -> None:
    """A GCS whose pull period was configured away from Ray's default second may fit the
    timetable by chance (0.7 s fits every 7 s): on average a demand is still seen sooner
    than at the steady pace, and never more than a period late."""
    rng = random.Random(3)
    arrivals = sorted(rng.uniform(1, 200) for _ in range(40))
    gcs = Gcs(period=period, phase=0.1, arrivals=arrivals, jitter_s=0.002)
    delays, _ = run_wait(gcs, GcsCadence(), 210)
    assert len(delays) == len(arrivals)
    assert sum(delays) / len(delays) < 0.275, sum(delays) / len(delays)
    assert max(delays) < 1.05, max(delays)


def test_one_change_off_the_timetable_does_not_throw_it_away() -> None:
    cadence = GcsCadence()
    for k in range(5):  # publications at k + 0.4, seen by reads 50 ms apart
        cadence.note(k, k + 0.38, k + 0.381)
        cadence.note(k + 1, k + 0.43, k + 0.431)
    before = cadence.next_publication(10.0)
    assert before is not None and before[0] <= 10.4 + 0.01 and before[1] >= 10.4
    cadence.note(99, 7.7, 7.701)  # a Raylet died: its demands dropped at once
    cadence.note(100, 7.75, 7.751)
    assert cadence.next_publication(10.0) == before
    assert cadence.strikes == 1


def test_a_late_answer_to_an_older_read_is_not_taken_for_a_change() -> None:
    cadence = GcsCadence()
    cadence.note(1, 10.0, 10.001)
    cadence.note(1, 9.5, 10.002)  # sent before the newest read: says nothing new
    cadence.note(1, 10.5, 10.501)
    assert cadence.windows == []


def test_nothing_learned_means_nothing_predicted_and_a_long_quiet_forgets() -> None:
    cadence = GcsCadence()
    assert cadence.next_publication(5.0) is None
    for k in range(3):  # publications at k + 0.33, each seen by reads 50 ms apart
        cadence.note(2 * k, k + 0.30, k + 0.301)
        cadence.note(2 * k + 1, k + 0.35, k + 0.351)
        if k == 0:  # one window is not a timetable yet
            assert cadence.next_publication(3.0) is None
    near = cadence.next_publication(3.0)
    assert near is not None and near[0] <= 3.33 <= near[1] and near[1] - near[0] < 0.07
    # the period is known to 1.5 ms at best from windows two seconds apart
    assert cadence.next_publication(3.0 + 200) is None


def test_the_last_publication_before_a_read_bounds_a_real_one_and_the_latest() -> None:
    """What a grow's hold ends on (`GcsCadence.last_publication`): a window that holds
    a publication Ray really made by then, and no later one was certainly made before."""
    fresh = GcsCadence()
    assert fresh.last_publication(10.0) is None
    # one change seen between two reads, nothing learned yet: that change is the one
    fresh.note(1, 0.0, 0.001)
    fresh.note(2, 0.5, 0.501)
    assert fresh.last_publication(0.4) is None  # not known by then
    assert fresh.last_publication(0.6) == (0.0, 0.501)
    # a learned timetable places the ones since, with no change to see
    gcs = Gcs(period=1.0004, phase=0.37, arrivals=busy_minute(3), jitter_s=0.002)
    cadence = GcsCadence()
    run_wait(gcs, cadence, 62)
    for before in (62.0, 62.5, 70.25, 80.9):
        window = cadence.last_publication(before)
        assert window is not None, before
        earliest, latest = window
        k = math.floor((before - gcs.phase) / gcs.period)
        while gcs.publication(k) > before:
            k -= 1
        # a real publication is in the window, and the next one was not yet certain
        assert any(earliest <= gcs.publication(j) <= latest for j in (k - 1, k)), before
        assert latest <= before
        assert gcs.publication(k + 1) > earliest
