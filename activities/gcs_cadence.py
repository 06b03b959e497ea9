"""When a Ray GCS publishes task demands, learned from the reads that saw them change.

A Raylet's queued tasks reach the GCS's cluster state only when the GCS pulls every
Raylet's resource load, on a timer: every `gcs_pull_resource_loads_period_milliseconds`
(1,000 by default), re-armed after each pull, so the period is a little over a second and
steady (docs/design/ray-protocol.md §5.8a; on Ray 2.60: 1.0004 s, every publication within
±2.3 ms of the fitted line over 148 s). A read just after a publication sees a new demand
at once; a read at a random moment sees it half a period late on average.

`GcsCadence` turns the reads that saw the demands change into that timetable. Each such
pair of reads bounds one publication instant: after the earlier read was sent, no later
than the later read's answer. Windows are carried forward by whole periods and
intersected, which narrows both the instant and the period. The wait then reads Ray's
state once a period, just after the next publication, instead of twice a second at random
(`activities.cluster`): fewer reads and a faster reaction. Where the windows disagree (a
GCS with another period, a restart), or the prediction has grown too uncertain after a long
quiet spell, `next_publication` says so (None) and the wait reads at a steady pace instead.

Pure bookkeeping on monotonic seconds, safe to share between threads: one per GCS address
per worker process.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

# Ray's default pull period, and how much slower the timer's re-arming may make it: at
# least the nominal second, at most 1.5 ms more (measured: 0.4 ms). A GCS outside this
# range never locks, and is read at the steady pace.
PERIOD_MIN_S = 1.0
PERIOD_MAX_S = 1.0015
# A pair of reads further apart than this bounds a publication too loosely to start a
# timetable from (it still narrows one that exists).
WIDEST_WINDOW_S = 0.6
# Beyond this uncertainty about the next publication, aligning reads is a guess.
MOST_UNCERTAIN_S = 0.2
# Observations that contradict the timetable this many times in a row replace it (one alone
# may be a change the GCS made outside its pulls: a Raylet's death drops its demands).
STRIKES_TO_RELEARN = 2
# Publications stray this far from a steady timetable (measured: ±2.3 ms).
JITTER_S = 0.003
# Windows that must fit one timetable before reads are timed by it: a GCS on another
# period may fit one by chance, hardly two.
CONFIRMATIONS = 2
KEPT_WINDOWS = 32  # the period's bounds keep what older windows taught
# A timetable another worker learned (handed on by the reconcile workflow) is trusted this
# much less: two machines' clocks agree to NTP's few milliseconds. Its last windows go.
CLOCK_SKEW_S = 0.005
HANDED_WINDOWS = 8


@dataclass(frozen=True)
class Timetable:
    """What a `GcsCadence` learned, on an epoch clock: to hand to another worker."""

    period: tuple[float, float]
    windows: tuple[tuple[int, float, float], ...]  # (publication number, earliest, latest)
    confirmed: int


@dataclass
class GcsCadence:
    """The timetable of one GCS's demand publications; see the module's docstring.

    `windows` holds (publication number, earliest, latest) of publications seen, numbered
    from the first; `period` bounds the period. Every pair of windows bounds the period
    (the further apart, the tighter), and every window, carried forward, bounds the next.
    """

    period: tuple[float, float] = (PERIOD_MIN_S, PERIOD_MAX_S)
    windows: list[tuple[int, float, float]] = field(default_factory=list)
    strikes: int = 0
    confirmed: int = 0  # windows that fitted the timetable since it was (re)started
    _last: tuple[int, float] | None = None  # (demands digest, when that read was sent)
    # the last publication seen as such: a pair of reads that saw the demands change
    _seen: tuple[float, float] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def note(self, digest: int, sent: float, received: float) -> None:
        """A read sent at `sent` and answered at `received` saw demands `digest`."""
        with self._lock:
            last = self._last
            if last is not None and sent < last[1]:
                return  # an older read answered late: the newer one already counted
            self._last = (digest, sent)
            if last is not None and last[0] != digest:
                self._seen = (last[1], received)
                self._observe(last[1], received)

    def _observe(self, lo: float, hi: float) -> None:
        """A publication happened in (lo, hi]."""
        lo, hi = lo - JITTER_S, hi + JITTER_S
        narrow = hi - lo <= WIDEST_WINDOW_S
        if not self.windows:
            if narrow:
                self.windows = [(0, lo, hi)]
            return
        n_last, a_lo, a_hi = self.windows[-1]
        p_lo, p_hi = self.period
        k_min = max(0, math.ceil((lo - a_hi) / p_hi))
        k_max = math.floor((hi - a_lo) / p_lo)
        if k_max < k_min:
            self._strike(lo, hi)
            return
        if k_max > k_min:
            # the period is not known well enough to count the periods between (a wide
            # window after a long quiet): let a narrower one that follows do it
            return
        n = n_last + k_min
        for m, w_lo, w_hi in self.windows:
            if m < n:
                p_lo = max(p_lo, (lo - w_hi) / (n - m))
                p_hi = min(p_hi, (hi - w_lo) / (n - m))
        if p_lo > p_hi:
            self._strike(lo, hi)
            return
        # the observed window, narrowed by every window carried forward to it (a strike
        # restarts from the observation itself, not from an empty intersection)
        new_lo = max([lo] + [w_lo + (n - m) * p_lo for m, w_lo, _ in self.windows])
        new_hi = min([hi] + [w_hi + (n - m) * p_hi for m, _, w_hi in self.windows])
        if new_lo > new_hi:
            self._strike(lo, hi)
            return
        if n == n_last:
            self.windows.pop()
        self.windows.append((n, new_lo, new_hi))
        del self.windows[:-KEPT_WINDOWS]
        self.period, self.strikes = (p_lo, p_hi), 0
        if n > n_last:
            self.confirmed += 1

    def _strike(self, lo: float, hi: float) -> None:
        self.strikes += 1
        if self.strikes >= STRIKES_TO_RELEARN:
            self.windows = [(0, lo, hi)] if hi - lo <= WIDEST_WINDOW_S else []
            self.period, self.strikes, self.confirmed = (PERIOD_MIN_S, PERIOD_MAX_S), 0, 0

    def next_publication(
        self, now: float, most_uncertain: float = MOST_UNCERTAIN_S
    ) -> tuple[float, float] | None:
        """(earliest, latest) instant of the first publication that may still come at or
        after `now`; None while the timetable is unknown, or less certain than
        `most_uncertain` seconds."""
        with self._lock:
            if not self.windows or self.confirmed < CONFIRMATIONS:
                return None
            earliest, latest = self._carried(
                max(0, math.ceil((now - self.windows[-1][2]) / self.period[1]))
            )
            if latest - earliest > most_uncertain:
                return None
            return earliest, latest

    def timetable(self, to_epoch: float) -> Timetable | None:
        """What was learned, to hand to another worker: the period's bounds, the last
        HANDED_WINDOWS windows (number, earliest, latest) on the clock of `to_epoch`
        added to monotonic seconds, and how many windows confirmed them; None before
        the first window."""
        with self._lock:
            if not self.windows:
                return None
            windows = tuple((n, lo + to_epoch, hi + to_epoch) for n, lo, hi in self.windows)
            return Timetable(self.period, windows[-HANDED_WINDOWS:], self.confirmed)

    def adopt(self, given: Timetable, to_epoch: float) -> bool:
        """Take what another worker learned (`timetable`) when it knows more than this
        one: two workers take a cluster's waits in turn, and each would otherwise learn
        only from the changes its own reads saw (and read at the steady pace until it
        had seen three). False (nothing changed) when this one knows as much, or what is
        given is no timetable of Ray's timer."""
        p_lo, p_hi = given.period
        numbers = [n for n, _, _ in given.windows]
        if not (
            PERIOD_MIN_S <= p_lo <= p_hi <= PERIOD_MAX_S
            and numbers
            and numbers == sorted(set(numbers))
            and all(0 <= hi - lo <= WIDEST_WINDOW_S for _, lo, hi in given.windows)
        ):
            return False
        windows = [
            (n, lo - to_epoch - CLOCK_SKEW_S, hi - to_epoch + CLOCK_SKEW_S)
            for n, lo, hi in given.windows
        ]
        with self._lock:
            if self.windows:
                # more windows confirmed, or as many and a later publication seen (one
                # handed back and forth is no news: it is not taken, nor widened again)
                mine, theirs = self.windows[-1], windows[-1]
                later = (theirs[1] + theirs[2]) / 2 > (mine[1] + mine[2]) / 2 + PERIOD_MIN_S / 2
                if given.confirmed < self.confirmed or (
                    given.confirmed == self.confirmed and not later
                ):
                    return False
            self.windows, self.period = windows, (p_lo, p_hi)
            self.strikes, self.confirmed = 0, max(0, given.confirmed)
            return True

    def _carried(self, n: int) -> tuple[float, float]:
        """(earliest, latest) instant of the publication `n` periods after the last one
        seen (the caller holds the lock, with a timetable)."""
        _, a_lo, a_hi = self.windows[-1]
        p_lo, p_hi = self.period
        return a_lo + n * p_lo, a_hi + n * p_hi

    def last_publication(self, before: float) -> tuple[float, float] | None:
        """(earliest, latest) instant of the last demand publication certainly made by
        `before`: the later of the last one seen (a pair of reads, both sent by then,
        that saw the demands change) and, with the timetable confirmed, the last one it
        places by then. None when neither is known."""
        with self._lock:
            seen = self._seen if self._seen is not None and self._seen[1] <= before else None
            placed = None
            if self.windows and self.confirmed >= CONFIRMATIONS:
                n = math.floor((before - self.windows[-1][2]) / self.period[1])
                window = self._carried(n)
                if n >= 0 and window[1] - window[0] <= MOST_UNCERTAIN_S:
                    placed = window
        known = [w for w in (seen, placed) if w is not None]
        return max(known) if known else None


# How often the wait reads Ray's state (the GCS has no watch). Right after an observe,
# when a change is most likely to follow (a Raylet resized, a node registering), every
# 0.1 s. Once the cluster has been quiet for RAY_FAST_WINDOW_S: once a second, just after
# the GCS publishes the Raylets' demands, when that timetable is known (gcs_cadence);
# every 0.55 s while it is not. Some fast reads land inside the doubt about a publication
# and one just after it: that is how the timetable is learned. Never more than a tenth of
# the time on the GCS: the state of a thousand nodes takes ~50 ms to build.
RAY_FAST_PAUSE_S = 0.1
RAY_FAST_WINDOW_S = 5.0
RAY_IDLE_PAUSE_S = 0.55
AFTER_PUBLICATION_S = 0.015  # the GCS takes the Raylets' answers in a few ms
PIN_STEP_S = 0.01  # fast reads: no closer than this inside the doubt


def ray_read_pause(
    quiet_s: float,
    read_s: float,
    now: float = 0.0,
    publication: tuple[float, float] | None = None,
) -> float:
    """Seconds to the next read of Ray's state, `quiet_s` into a wait whose last read
    took `read_s`; `publication`: the next demand publication's (earliest, latest)
    instant on the clock of `now`, when known (`GcsCadence.next_publication`)."""
    floor = 9 * read_s
    fast = quiet_s < RAY_FAST_WINDOW_S
    if publication is None:
        return max(RAY_FAST_PAUSE_S if fast else RAY_IDLE_PAUSE_S, floor)
    earliest, latest = publication
    pause = latest + AFTER_PUBLICATION_S - now
    if fast:
        # reading often anyway: a few reads inside the doubt about the instant as well,
        # so that a change is pinned between two of them and the timetable sharpens
        step = max(PIN_STEP_S, (latest - earliest) / 10)
        inside = earliest + step * max(0, math.floor((now - earliest) / step + 1))
        if inside < latest:
            pause = min(pause, inside - now)
        return max(min(pause, RAY_FAST_PAUSE_S), floor)
    while pause < floor:  # a slow GCS: skip publications rather than load it
        pause += PERIOD_MIN_S
    return pause


def next_read_pause(quiet_s: float, read_s: float, now: float, cadence: GcsCadence) -> float:
    """`ray_read_pause` with what `cadence` knows of the next publication: fast reads pin
    it while the doubt is up to WIDEST_WINDOW_S; quiet reads wait for it only when it is
    known to MOST_UNCERTAIN_S."""
    doubt = WIDEST_WINDOW_S if quiet_s < RAY_FAST_WINDOW_S else MOST_UNCERTAIN_S
    return ray_read_pause(quiet_s, read_s, now, cadence.next_publication(now, doubt))
