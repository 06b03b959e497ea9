"""Blocking calls, each on the threads of the target it talks to: one slow or blackholed
target delays only its own calls.

A target is what a blocking call waits on: the Kubernetes API server (one per Kube host),
one Ray GCS (per address), or the planner (pure CPU, `plan`). Every blocking call of the
activities runs here instead of `asyncio.to_thread`.

Why each target has threads of its own, and not one large pool with a limit per target.
asyncio's default executor is one pool of min(32, cores + 4) threads (6 on a 2-core
machine), first come first served: six GCS calls to blackholed addresses, 10 s each, held
every thread, and every other cluster's Kubernetes reads, GCS reads and plans queued
behind them. A shared pool of P threads with a semaphore of N per target only moves the
edge: k slow targets hold min(P, k*N) threads, so isolation holds while k*N < P, and k is
set by the world (a NetworkPolicy that blackholes one namespace puts dozens of clusters
behind it), not by raysize. With threads per target, a target holds at most N threads,
all its own; no call to another target ever queues behind them, however many targets
hang. The cost is that threads are not shared between targets, so they are made when a
target has more calls than idle threads (up to N) and each one ends after `idle_s` with
nothing to do; a target with no thread and no call is forgotten. The threads alive are
the calls in flight plus those idle for less than `idle_s`: bounded by what the fleet
does, never by its size (a thousand quiet clusters hold no thread). There is deliberately
no bound across targets: it would be a shared queue again.

A call waits for a thread of its target on the event loop (a task, cancellable): a
Temporal cancellation (or the worker's shutdown) takes it out of the queue at once, and a
call that finds no thread within `wait_s` (the target's own call timeout) fails as that
target being unavailable, as the call itself would have after its timeout, without
being sent, unless the target answered a call within the last `wait_s`: then its queue
is long, not its server gone (a burst paced by the QPS limit), and the call waits on. A
call already running cannot be stopped (the clients block); it keeps its thread until
its own timeout ends it, and its result is dropped. So a target's thread count stays
within N even while its callers give up.

Waiting calls are not one FIFO. A target's threads are shared by every Ray cluster (one
API server serves them all), and one cluster's list storm or large scale-in queued
hundreds of calls ahead of another cluster's saga write, which then failed unsent after
its 10 s wait. So each call names its cluster (`key`) and whether it is one of the writes
a saga or a reconcile waits on (`write`: the resize patch, `ray.io/ippr-status`, the
RayCluster's scale). A free thread takes the writes first, then the reads; within each,
one call per cluster in turn (round-robin over the clusters with calls waiting), so a
cluster with a hundred calls waiting delays another cluster's next call by at most one
of its own per thread.

`Targets.load()` says, per target, the calls running and waiting and its threads; a
target that first has to queue calls says so in one WARNING line (again after it drained).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from raysize.activities.k8s_errors import Unavailable
from raysize.activities.kube_limits import KubeLimits
from raysize.activities.ray_errors import RayUnavailable

log = logging.getLogger("raysize.activities")

T = TypeVar("T")

# per API server: every cluster's reads and writes share them (RAYSIZE_KUBE_THREADS). The
# client's connection pool is sized to match (`activities.k8s.fit_pool`)
KUBE_THREADS = 8
GCS_THREADS = 4  # per GCS: a cluster's observe, with its Raylet resizes and drains
PLAN_THREADS = 2  # the planner is pure Python: more threads only share the GIL
IDLE_S = 10.0  # a thread with nothing to do for this long ends


# what a call that reached no server ends with: no sign that the target answers
_NO_ANSWER = (Unavailable, RayUnavailable, TimeoutError, OSError)


def cluster_key(namespace: str, cluster: str) -> str:
    """The `key` of a Ray cluster's calls: they take turns with other clusters'."""
    return f"{namespace}/{cluster}"


# whose calls the running activity makes (`cluster_key`), set once at its start
# (`calls_of`): each activity runs in a task of its own, with its own copy of the context
_CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("raysize_caller", default="")


def calls_of(namespace: str, cluster: str) -> None:
    """The running activity (task) works for this Ray cluster: its blocking calls take
    turns with other clusters' (`cluster=""`: its namespace's calls of no known cluster)."""
    _CALLER.set(cluster_key(namespace, cluster))


@dataclass(frozen=True)
class Load:
    """One target now: calls running (one thread each), calls waiting for a thread, and
    its threads (running, or idle for less than `idle_s`)."""

    running: int
    waiting: int
    threads: int


class _Call:
    __slots__ = ("fn", "future", "key", "loop", "started", "timer", "write")

    def __init__(
        self,
        fn: Callable[[], Any],
        loop: asyncio.AbstractEventLoop,
        key: str = "",
        write: bool = False,
    ) -> None:
        self.fn = fn
        self.loop = loop
        self.key = key  # whose call (a cluster): its turn among the others'
        self.write = write  # a write a saga or a reconcile waits on: before the reads
        self.future: asyncio.Future[Any] = loop.create_future()
        self.started = False
        self.timer: asyncio.TimerHandle | None = None  # when its wait for a thread ends


class _Queue:
    """A target's waiting calls: the writes before the reads, and within each, the
    clusters (`_Call.key`) in turn, one call each, in the order they came (under the
    target's lock)."""

    def __init__(self) -> None:
        # [writes, reads]: key → its calls, in turn order (the next key first)
        self._lanes: tuple[OrderedDict[str, deque[_Call]], ...] = (OrderedDict(), OrderedDict())
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[_Call]:
        return (c for lane in self._lanes for calls in lane.values() for c in calls)

    def append(self, call: _Call) -> None:
        lane = self._lanes[0 if call.write else 1]
        calls = lane.get(call.key)
        if calls is None:
            lane[call.key] = calls = deque()  # a key with nothing waiting goes last
        calls.append(call)
        self._len += 1

    def popleft(self) -> _Call:
        """The next call: the first key's oldest; that key then goes last in its lane."""
        for lane in self._lanes:
            if lane:
                key, calls = next(iter(lane.items()))
                call = calls.popleft()
                if calls:
                    lane.move_to_end(key)
                else:
                    del lane[key]
                self._len -= 1
                return call
        raise IndexError("no call waits")

    def remove(self, call: _Call) -> None:
        lane = self._lanes[0 if call.write else 1]
        calls = lane.get(call.key)
        if calls is None:
            raise ValueError("not waiting")
        calls.remove(call)  # ValueError when not there
        if not calls:
            del lane[call.key]
        self._len -= 1

    def clear(self) -> None:
        for lane in self._lanes:
            lane.clear()
        self._len = 0


class _Target:
    def __init__(self, name: str, limit: int, lock: threading.Lock) -> None:
        self.name = name
        self.limit = limit
        self.queue = _Queue()
        self.cond = threading.Condition(lock)
        self.running = 0
        self.threads = 0
        self.idle = 0  # threads waiting for a call
        self.crowded = False  # said so in the log, until the queue drains
        self.moved = -math.inf  # when a call last came back with an answer


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller gave up (cancelled, or out of its wait)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class Targets:
    """The worker's threads for blocking calls, per target (see the module's text). One
    per worker process; `close()` on shutdown."""

    def __init__(
        self,
        *,
        kube_threads: int = KUBE_THREADS,
        gcs_threads: int = GCS_THREADS,
        plan_threads: int = PLAN_THREADS,
        idle_s: float = IDLE_S,
    ) -> None:
        for name, value in (
            ("kube_threads", kube_threads),
            ("gcs_threads", gcs_threads),
            ("plan_threads", plan_threads),
        ):
            if value < 1:
                raise ValueError(f"Targets({name}={value!r}): expected at least 1 thread")
        if not idle_s > 0:
            raise ValueError(f"Targets(idle_s={idle_s!r}): expected seconds > 0")
        self.kube_threads = kube_threads
        self.gcs_threads = gcs_threads
        self.plan_threads = plan_threads
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._targets: dict[str, _Target] = {}
        self._closed = False

    # --- the three kinds of target ----------------------------------------------------
    async def kube(
        self,
        host: str,
        wait_s: float | None,
        fn: Callable[..., T],
        *args: Any,
        limits: KubeLimits | None = None,
        key: str = "",
        write: bool = False,
    ) -> T:
        """`fn(*args)` on the threads of the Kubernetes API server at `host`; while that
        server's Retry-After runs (`limits`), the call waits on the event loop first.
        `key`: whose call (`cluster_key`; default: the activity's, `calls_of`), taking
        turns with the other clusters' calls; `write`: a saga's or a reconcile's write,
        sent before the reads waiting."""
        if limits is not None:
            await limits.held()

        def busy(limit: int, waited: float) -> Exception:
            return Unavailable(
                f"cannot reach the Kubernetes API at {host}: its {limit} calls in flight "
                f"did not end within {waited:g} s, so this one was not sent"
            )

        return await self.run(
            f"kube {host}",
            self.kube_threads,
            fn,
            *args,
            wait_s=wait_s,
            busy=busy,
            key=key,
            write=write,
        )

    async def on_kube(
        self, kube: Any, fn: Callable[..., T], *args: Any, key: str = "", write: bool = False
    ) -> T:
        """`fn(*args)` for a `Kube`: on its API server's threads, bounded by its call
        timeout, after its server's Retry-After (`Kube.limits`, when it has one); `key`
        and `write` as for `kube`."""
        return await self.kube(
            kube.host,
            kube.timeout_s,
            fn,
            *args,
            limits=getattr(kube, "limits", None),
            key=key,
            write=write,
        )

    async def gcs(self, address: str, wait_s: float | None, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the threads of the Ray GCS at `address`."""

        def busy(limit: int, waited: float) -> Exception:
            return RayUnavailable(
                f"Ray GCS at {address}: its {limit} calls in flight did not end within "
                f"{waited:g} s, so this one was not sent"
            )

        return await self.run(
            f"gcs {address}", self.gcs_threads, fn, *args, wait_s=wait_s, busy=busy
        )

    async def plan(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the planner's threads (CPU only: no wait bound)."""
        return await self.run("plan", self.plan_threads, fn, *args)

    # --- the mechanism ---------------------------------------------------------------
    async def run(
        self,
        name: str,
        limit: int,
        fn: Callable[..., T],
        *args: Any,
        wait_s: float | None = None,
        busy: Callable[[int, float], Exception] | None = None,
        key: str = "",
        write: bool = False,
    ) -> T:
        """`fn(*args)` on a thread of target `name` (at most `limit` threads), with the
        caller's context variables (Temporal's activity context, the trace), as
        `asyncio.to_thread` does. Waiting longer than `wait_s` for a thread raises
        `busy(limit, wait_s)`; cancelling the caller withdraws a call not yet started.
        Waiting calls go writes first, then one per `key` in turn (`_Queue`)."""
        loop = asyncio.get_running_loop()
        call = _Call(
            functools.partial(contextvars.copy_context().run, fn, *args),
            loop,
            key or _CALLER.get(),
            write,
        )
        crowded = False
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{name}: the worker's threads are closed (shutting down)")
            target = self._targets.get(name)
            if target is None:
                target = self._targets[name] = _Target(name, limit, self._lock)
            target.queue.append(call)
            if len(target.queue) > target.idle:
                if target.threads < target.limit:
                    target.threads += 1
                    try:
                        threading.Thread(
                            target=self._work, args=(target,), name=f"raysize {name}", daemon=True
                        ).start()
                    except BaseException:  # no thread to be had: this call is not made
                        target.queue.remove(call)
                        self._retire(target)
                        raise
                elif not target.crowded:
                    target.crowded = crowded = True
            target.cond.notify()
        if crowded:
            log.warning(
                "%s: all %d of its threads are busy; its next calls wait for one (calls "
                "to other targets do not)",
                name,
                limit,
            )
        if wait_s is not None:
            call.timer = loop.call_later(wait_s, self._expire, target, call, busy, wait_s)
        try:
            result: T = await call.future
            return result
        except asyncio.CancelledError:
            self._withdraw(target, call)
            raise
        finally:
            if call.timer is not None:
                call.timer.cancel()

    def _withdraw(self, target: _Target, call: _Call) -> bool:
        """Take a call that has not started out of its queue (False: it runs already)."""
        with self._lock:
            if call.started:
                return False
            with contextlib.suppress(ValueError):
                target.queue.remove(call)
            if not target.queue:
                target.crowded = False
            return True

    def _expire(
        self,
        target: _Target,
        call: _Call,
        busy: Callable[[int, float], Exception] | None,
        wait_s: float,
    ) -> None:
        if call.future.done():
            return
        with self._lock:
            quiet = time.monotonic() - target.moved
        if quiet < wait_s and not call.started:
            # the target answers (a call came back with an answer within `wait_s`): a
            # long queue, paced by the threads or the QPS limit, is no unreachable server.
            # Failed so, in a 1,000-cluster burst thousands of calls a minute came back
            # as activities' retries, more work behind the same queue. The caller's own
            # timeout bounds the wait; calls that only time out or fail are no answer
            call.timer = call.loop.call_later(
                wait_s - quiet, self._expire, target, call, busy, wait_s
            )
            return
        if not self._withdraw(target, call):
            return
        error = (
            busy(target.limit, wait_s)
            if busy is not None
            else TimeoutError(f"{target.name}: no thread free within {wait_s:g} s")
        )
        call.future.set_exception(error)

    def _work(self, target: _Target) -> None:
        while True:
            with self._lock:
                while not target.queue:
                    if self._closed:
                        return self._retire(target)
                    target.idle += 1
                    woken = target.cond.wait(self.idle_s)
                    target.idle -= 1
                    if not woken and not target.queue:
                        return self._retire(target)
                call = target.queue.popleft()
                call.started = True
                target.running += 1
                if not target.queue:
                    target.crowded = False
            result: Any = None
            error: BaseException | None = None
            try:
                result = call.fn()
            except Exception as exc:
                error = exc
            finally:
                with self._lock:
                    target.running -= 1
                    if not isinstance(error, _NO_ANSWER):
                        target.moved = time.monotonic()
            # a closed loop: nobody waits for the call any more
            with contextlib.suppress(RuntimeError):
                call.loop.call_soon_threadsafe(_settle, call.future, result, error)
            del call, result, error  # hold no result while idle

    def _retire(self, target: _Target) -> None:
        """A thread ends (lock held); a target without threads or calls is forgotten."""
        target.threads -= 1
        if target.threads == 0 and not target.queue and self._targets.get(target.name) is target:
            del self._targets[target.name]

    # --- inspection and shutdown -----------------------------------------------------
    def load(self) -> dict[str, Load]:
        """Each known target's calls running and waiting, and its threads."""
        with self._lock:
            return {
                name: Load(running=t.running, waiting=len(t.queue), threads=t.threads)
                for name, t in self._targets.items()
            }

    def close(self) -> None:
        """No more calls; those waiting fail, idle threads end now, and running ones end
        with their call (never waited for: a blackholed call must not hold the exit)."""
        with self._lock:
            self._closed = True
            dropped = [(t, c) for t in self._targets.values() for c in t.queue]
            for t in self._targets.values():
                t.queue.clear()
                t.cond.notify_all()
        for t, c in dropped:
            error = RuntimeError(f"{t.name}: the worker is shutting down; this call was not sent")
            with contextlib.suppress(RuntimeError):
                c.loop.call_soon_threadsafe(_settle, c.future, None, error)
