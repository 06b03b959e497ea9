"""activities/targets.py: each target's blocking calls on threads of its own, a bounded
number of them; waiting calls can be cancelled, time out as the target unavailable, and
fail on close; idle threads end."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from raysize.activities.k8s_errors import Unavailable
from raysize.activities.ray_errors import RayUnavailable
from raysize.activities.targets import Load, Targets


def until(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.01)


async def until_async(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        await asyncio.sleep(0.01)


def test_a_stuck_target_holds_only_its_own_threads():
    targets = Targets(gcs_threads=2)
    release = threading.Event()
    ran: list[str] = []

    async def scenario() -> None:
        stuck = [
            asyncio.ensure_future(targets.gcs("10.0.0.1:6379", None, release.wait))
            for _ in range(5)
        ]
        await until_async(lambda: targets.load().get("gcs 10.0.0.1:6379") == Load(2, 3, 2))
        # another GCS, the API server and the planner: none waits behind the stuck one
        assert await targets.gcs("10.0.0.2:6379", None, ran.append, "gcs") is None
        assert await targets.kube("https://k8s", None, ran.append, "kube") is None
        assert await targets.plan(ran.append, "plan") is None
        assert ran == ["gcs", "kube", "plan"]
        assert not any(t.done() for t in stuck)
        release.set()
        assert await asyncio.gather(*stuck) == [True] * 5

    try:
        asyncio.run(scenario())
    finally:
        targets.close()


def test_a_waiting_call_is_withdrawn_when_cancelled_and_never_runs():
    targets = Targets(kube_threads=1)
    release = threading.Event()
    ran: list[int] = []

    async def scenario() -> None:
        busy = asyncio.ensure_future(targets.kube("h", None, release.wait))
        queued = asyncio.ensure_future(targets.kube("h", None, ran.append, 1))
        await until_async(lambda: targets.load().get("kube h") == Load(1, 1, 1))
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert targets.load()["kube h"] == Load(1, 0, 1)
        # a running call's thread is held until it ends, whoever gave up on it
        busy.cancel()
        assert targets.load()["kube h"].running == 1
        release.set()
        await until_async(lambda: targets.load()["kube h"].running == 0)
        assert ran == []

    try:
        asyncio.run(scenario())
    finally:
        targets.close()


def test_a_call_that_finds_no_thread_in_its_wait_is_the_target_unavailable():
    targets = Targets(kube_threads=1, gcs_threads=1)
    release = threading.Event()

    async def scenario() -> None:
        held = [
            asyncio.ensure_future(targets.kube("https://k8s:6443", None, release.wait)),
            asyncio.ensure_future(targets.gcs("10.0.0.9:6379", None, release.wait)),
        ]
        await until_async(lambda: sum(x.running for x in targets.load().values()) == 2)
        with pytest.raises(Unavailable, match=r"https://k8s:6443: its 1 calls in flight"):
            await targets.kube("https://k8s:6443", 0, print, "never")
        with pytest.raises(RayUnavailable, match=r"10\.0\.0\.9:6379: its 1 calls in flight"):
            await targets.gcs("10.0.0.9:6379", 0, print, "never")
        assert [x.waiting for x in targets.load().values()] == [0, 0]
        release.set()
        await asyncio.gather(*held)

    try:
        asyncio.run(scenario())
    finally:
        targets.close()


def test_a_long_queue_of_a_target_that_answers_waits_its_turn():
    """One thread, calls of 50 ms each, twenty queued with a wait of 0.3 s: the last one
    starts after about a second. The target answers all along, so its queue is long, not
    its server gone: every call runs (before, those past the sixth failed as the target
    unavailable, and in a 1,000-cluster burst, paced by the QPS limit, thousands a minute
    came back as activities' retries)."""
    targets = Targets(kube_threads=1)

    async def scenario() -> list[int]:
        def answer(i: int) -> int:
            time.sleep(0.05)
            return i

        return await asyncio.gather(
            *(targets.kube("https://k8s:6443", 0.3, answer, i) for i in range(20))
        )

    try:
        assert asyncio.run(scenario()) == list(range(20))
    finally:
        targets.close()


def test_a_queue_behind_calls_that_only_time_out_still_fails_in_its_wait():
    """The same queue where every call ends without an answer (a blackholed GCS: each
    call times out): no answer, so the calls past the wait fail as the target unavailable,
    and none waits much longer than its wait."""
    targets = Targets(gcs_threads=1)

    async def scenario() -> list[float]:
        def no_answer() -> None:
            time.sleep(0.1)
            raise TimeoutError("timed out")

        async def one() -> float:
            t0 = time.monotonic()
            with pytest.raises((TimeoutError, RayUnavailable)):
                await targets.gcs("10.0.0.9:6379", 0.3, no_answer)
            return time.monotonic() - t0

        return await asyncio.gather(*(one() for _ in range(20)))

    try:
        waited = asyncio.run(scenario())
        assert max(waited) < 1.0, waited  # 20 in turn would take 2 s
    finally:
        targets.close()


def test_errors_and_context_variables_cross_the_thread():
    targets = Targets()
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    def boom() -> None:
        raise ValueError(var.get())

    async def scenario() -> None:
        var.set("the caller's")
        assert await targets.plan(var.get) == "the caller's"
        with pytest.raises(ValueError, match="the caller's"):
            await targets.kube("h", None, boom)

    try:
        asyncio.run(scenario())
    finally:
        targets.close()


def test_idle_threads_end_and_quiet_targets_are_forgotten():
    targets = Targets(idle_s=0.05)

    names = {f"gcs 10.0.0.{i}:6379" for i in range(50)}

    async def calls() -> None:
        await asyncio.gather(*(targets.gcs(n.split()[1], None, int, "1") for n in names))

    asyncio.run(calls())
    until(lambda: targets.load() == {})
    until(
        lambda: not [t for t in threading.enumerate() if t.name.removeprefix("raysize ") in names]
    )
    targets.close()


def test_close_fails_waiting_calls_and_refuses_new_ones():
    targets = Targets(gcs_threads=1)
    release = threading.Event()

    async def scenario() -> None:
        running = asyncio.ensure_future(targets.gcs("a", None, release.wait))
        waiting = asyncio.ensure_future(targets.gcs("a", None, print, "never"))
        await until_async(lambda: targets.load().get("gcs a") == Load(1, 1, 1))
        targets.close()
        with pytest.raises(RuntimeError, match="shutting down; this call was not sent"):
            await waiting
        with pytest.raises(RuntimeError, match="closed"):
            await targets.plan(print)
        release.set()
        assert await running is True

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"kube_threads": 0}, "kube_threads=0"),
        ({"gcs_threads": -1}, "gcs_threads=-1"),
        ({"plan_threads": 0}, "plan_threads=0"),
        ({"idle_s": 0}, "idle_s=0"),
    ],
)
def test_bad_sizes_are_refused_by_name(kwargs, named):
    with pytest.raises(ValueError, match=named):
        Targets(**kwargs)


def test_a_server_s_retry_after_is_waited_out_before_a_thread_is_taken():
    """A throttling API server's Retry-After holds its calls on the event loop: held in
    their threads, a server's few threads would all sit out the hold, and the calls
    queued behind them would fail as the server unreachable, never sent."""
    from raysize.activities.kube_limits import KubeLimits

    now = [100.0]
    limits = KubeLimits("h", clock=lambda: now[0])
    targets = Targets(kube_threads=1)
    ran: list[int] = []

    async def scenario() -> None:
        limits.throttled(30.0)  # the server said: not for 30 s
        held = [
            asyncio.ensure_future(targets.kube("h", 0.5, ran.append, i, limits=limits))
            for i in range(3)
        ]
        await asyncio.sleep(1.0)  # longer than each call's wait for a thread (0.5 s)
        assert not any(t.done() for t in held) and ran == []
        assert "kube h" not in targets.load(), "a held call took a thread"
        now[0] += 30.0  # the Retry-After passed
        await asyncio.wait_for(asyncio.gather(*held), timeout=10)
        assert sorted(ran) == [0, 1, 2]

    try:
        asyncio.run(scenario())
    finally:
        targets.close()
