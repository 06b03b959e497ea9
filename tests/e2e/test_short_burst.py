"""A short burst buys no more than what waited, and nothing once it is over (issue #29):
six 1-CPU tasks of 2 s on one 1-CPU worker that may grow to 4 CPU, real Ray, both worlds.

Five tasks wait while the first runs. What raysize may add for them: at most their 5 CPU
(grows in place and launched pods at the size they end at), and no launch decided once
the tasks have all finished (Ray's demand list lags a grow by up to one publication: a
plan on that stale list would buy for work already done)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from kubernetes.utils import parse_quantity

from .conftest import Stack, ippr_cluster, stop_driver

TASKS, HOLD_S = 6, 2.0


@dataclass
class Replicas:
    """The worker group's `replicas` in the RayCluster's spec, polled: when it went up."""

    stack: Stack
    name: str
    raised: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, replicas)
    stop: threading.Event = field(default_factory=threading.Event)

    def _poll(self) -> None:
        last = None
        while not self.stop.wait(0.1):
            try:
                group = self.stack.raycluster(self.name)["spec"]["workerGroupSpecs"][0]
            except Exception:  # a read that failed: the next one
                continue
            replicas = int(group.get("replicas") or 0)
            if last is not None and replicas > last:
                self.raised.append((time.monotonic(), replicas))
            last = replicas

    @contextmanager
    def watching(self) -> Iterator[Replicas]:
        thread = threading.Thread(target=self._poll, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            thread.join(5)


def cpu_of(pod: object) -> float:
    return float(parse_quantity(pod.spec.containers[0].resources.limits["cpu"]))  # type: ignore[attr-defined]


async def test_a_short_burst_buys_no_more_than_waited_and_nothing_after_it(
    any_stack: Stack,
) -> None:
    stack = any_stack
    name = stack.unique("burst")
    stack.create(ippr_cluster(name, idle_timeout_s=120))
    gcs = await stack.gcs_address(name)
    (first,) = await stack.running_workers(name)
    before = cpu_of(first)
    with Replicas(stack, name).watching() as replicas:
        driver = stack.driver(name, gcs, ",".join(["1"] * TASKS), timeout_s=150, hold_s=HOLD_S)
        try:
            out, err = await asyncio.to_thread(driver.communicate, timeout=170)
        finally:
            stop_driver(driver)
        done = time.monotonic()  # every task has finished (the driver printed them all)
        assert driver.returncode == 0, err[-2000:]
        assert sum(line.startswith("ran with 1 CPU") for line in out.splitlines()) == TASKS
        await asyncio.sleep(5)  # what raysize does just after: a stale list would buy now
    pods = stack.workers(name)
    added = sum(cpu_of(p) for p in pods) - before
    late = [n for t, n in replicas.raised if t > done]
    print(
        f"burst {name}: {TASKS} x 1 CPU for {HOLD_S:g} s; pods "
        f"{sorted((p.metadata.name, cpu_of(p)) for p in pods)}; added {added:g} CPU; "
        f"replicas raised {[(round(t - done, 2), n) for t, n in replicas.raised]} s from the end"
    )
    assert added <= TASKS - 1, f"bought {added:g} CPU for {TASKS - 1} waiting"
    assert late == [], f"replicas raised after the burst ended: {late}"
