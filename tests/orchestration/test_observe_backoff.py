"""Failed observes back off: each wait longer than the one before, up to a cap, jittered,
kept across continue-as-new, reset by a read that works; a throttled read waits out the
API server's Retry-After. Against the real time-skipping server (its clock, not the
wall's), with a scripted cluster."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from raysize.workflows.contracts import Err
from raysize.workflows.reconcile_workflow import ReconcileWorkflow
from raysize.workflows.waiting import backoff_s

from ..workflows.kit import group, pod, res, snapshot
from .fake_world import FakeWorld
from .test_reconcile_workflow import reconciling, status_of, until

# the observe's own retries (RetryPolicy: 0.2 s, then 0.4 s) and the moments a workflow
# task and an activity take on the test server's clock
SLACK_S = 0.5


def _world() -> FakeWorld:
    return FakeWorld(snapshot([group(max_cpu=None)], [pod("w1", free_cpu=0)], [(res(1), 2)]))


def _waits(attempts: list[tuple[int, datetime]]) -> list[float]:
    """Seconds from each failed observe's last attempt to the next observe's first."""
    waits = []
    for (n, at), (next_n, next_at) in itertools.pairwise(attempts):
        if next_n == 1 and n > 1:
            waits.append((next_at - at).total_seconds())
    return waits


def _script(world: FakeWorld, steps: str, error: Callable[[], Exception]) -> None:
    """Each observe attempt in turn: `f` fails with `error`, `o` reads; after the last
    step the RayCluster is gone (the loop ends)."""
    left = iter(steps)

    def read() -> None:
        step = next(left, "")
        if step == "f":
            raise error()
        if not step:
            world.found = False

    world.on_read = read


def _timed_out() -> Exception:
    return ApplicationError("list pods: timed out", type="KubernetesUnavailable")


def test_the_backoff_doubles_up_to_its_cap_and_keeps_at_least_half() -> None:
    assert [backoff_s(5, n, 60, 0.999999) for n in range(1, 7)] == pytest.approx(
        [5, 10, 20, 40, 60, 60], rel=1e-5
    )
    assert [backoff_s(5, n, 60, 0.0) for n in range(1, 7)] == [2.5, 5, 10, 20, 30, 30]
    assert backoff_s(5, 10_000, 60, 0.5) == 45  # no overflow after a long outage


async def test_failed_observes_wait_longer_each_time_up_to_a_cap_jittered(
    ts_env: WorkflowEnvironment,
) -> None:
    world = _world()
    world.fail_observe = 10_000  # the API server is down
    async with reconciling(
        ts_env, world, retry_s=2.0, retry_max_s=16.0, max_ticks_per_run=3
    ) as handle:
        # the test server's clock jumps over the waits (and the runs' continue-as-new)
        await ts_env.sleep(timedelta(seconds=90))
        status = await status_of(handle)
        failures = sum(1 for n, _ in world.observe_attempts if n == 1)
        assert failures >= 6
        # the clock may stop inside an observe: its first attempt counted, its failure
        # (after its retries) not yet recorded by the loop
        assert status.observe_failures in (failures, failures - 1)
        failures = status.observe_failures
        said = re.fullmatch(
            r"observe failed (\d+) times in a row, next try in ([\d.]+) s; no action this "
            r"tick: list pods: timed out",
            status.last_error,
        )
        assert said is not None, status.last_error
        assert int(said.group(1)) == failures and 8.0 <= float(said.group(2)) <= 16.0
        # the API server is back, and the RayCluster was deleted meanwhile: the loop ends
        world.fail_observe = 0
        world.found = False
        assert await handle.result() == "RayCluster deleted"
    waits = _waits(world.observe_attempts)
    assert len(waits) >= 6
    nominal = [min(16.0, 2.0 * 2**i) for i in range(len(waits))]
    for wait, full in zip(waits, nominal, strict=True):
        assert full / 2 <= wait <= full + SLACK_S, (waits, nominal)
    # it grows while below the cap (the ranges [1, 2], [2, 4], [4, 8], [8, 16] follow on)
    assert waits[:4] == sorted(waits[:4]), waits
    # capped, across three continue-as-new: the count was carried, not started again
    assert all(w >= 8.0 for w in waits[3:]), waits
    # jittered: not the nominal waits (each is uniform in its upper half)
    assert any(abs(w - full) > 0.1 for w, full in zip(waits, nominal, strict=True)), waits


async def test_a_read_that_works_resets_the_backoff(ts_env: WorkflowEnvironment) -> None:
    world = _world()
    # four failed observes (three attempts each), one that reads, one more that fails
    _script(world, "fff" * 4 + "o" + "fff", _timed_out)
    async with reconciling(ts_env, world, retry_s=2.0, retry_max_s=16.0) as handle:
        assert await handle.result() == "RayCluster deleted"
    waits = _waits(world.observe_attempts)
    assert len(waits) == 5, world.observe_attempts
    assert 8.0 <= waits[3] <= 16.0 + SLACK_S  # the fourth failure's wait: 16 s nominal
    # the failure after a read that worked waits as the first one did (2 s nominal), not
    # as a fifth would (16 s)
    assert 1.0 <= waits[4] <= 2.0 + SLACK_S, waits


async def test_a_throttled_observe_waits_out_the_retry_after(ts_env: WorkflowEnvironment) -> None:
    """The activity's retries wait the Retry-After (Temporal honours next_retry_delay), and
    so does the loop after the observe's last attempt, though its own back-off is 1 s."""
    world = _world()

    def throttled() -> Exception:
        return ApplicationError(
            "the Kubernetes API server is throttling raysize (429 Too Many Requests)",
            type=Err.KUBE_THROTTLED,
            next_retry_delay=timedelta(seconds=7),
        )

    _script(world, "fff", throttled)
    async with reconciling(ts_env, world, retry_s=1.0) as handle:
        assert await handle.result() == "RayCluster deleted"
    assert [n for n, _ in world.observe_attempts] == [1, 2, 3, 1]
    times = [at for _, at in world.observe_attempts]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    assert all(7.0 <= g <= 7.0 + SLACK_S for g in gaps), gaps


async def test_a_throttled_observe_holds_no_workflow_task_while_it_waits(
    ts_env: WorkflowEnvironment,
) -> None:
    """The observe is a local activity: a retry due after a long Retry-After waits on a
    workflow timer (`LOCAL_RETRY_THRESHOLD`). Slept inside the workflow task, it held the
    task, and a query (`raysize status`) waited for the whole Retry-After."""
    world = _world()
    throttled = 0

    def read() -> None:
        nonlocal throttled
        throttled += 1
        raise ApplicationError(
            "the Kubernetes API server is throttling raysize (429 Too Many Requests)",
            type=Err.KUBE_THROTTLED,
            next_retry_delay=timedelta(seconds=60),
        )

    world.on_read = read
    async with reconciling(ts_env, world) as handle:
        await until(lambda: throttled >= 1)
        # answered within 5 s: the task that observed has completed
        status = await handle.query(ReconcileWorkflow.status, rpc_timeout=timedelta(seconds=5))
    assert status.observe_failures == 0  # the observe's own retries still run


async def test_failed_waits_back_off_too(ts_env: WorkflowEnvironment) -> None:
    """A wait (the watch) that fails again and again, while the reads work: the pause
    before the next observe grows as after failed reads."""
    world = _world()
    world.fail_wait = 4
    _script(world, "ooooo", _timed_out)  # five reads, then the RayCluster is gone
    async with reconciling(ts_env, world, retry_s=2.0, retry_max_s=16.0) as handle:
        assert await handle.result() == "RayCluster deleted"
    starts = [at for _, at in world.observe_attempts]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(starts)]
    assert len(gaps) == 5, gaps
    for gap, full in zip(gaps, (2.0, 4.0, 8.0, 16.0), strict=False):
        assert full / 2 <= gap <= full + SLACK_S, gaps
