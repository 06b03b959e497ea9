"""A benchmark stopped with SIGTERM still stops what it started: its `finally` runs."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from bench.procs import stop_on_sigterm


def test_a_sigterm_unwinds_an_async_benchmark_through_its_finally_blocks() -> None:
    stopped: list[str] = []

    async def bench() -> None:
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGTERM)
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0)  # the cleanup may still await: the loop runs it
            stopped.append("every process group")

    previous = signal.getsignal(signal.SIGTERM)
    try:
        stop_on_sigterm()
        with pytest.raises(SystemExit) as exited:
            asyncio.run(bench())
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert exited.value.code == 128 + signal.SIGTERM
    assert stopped == ["every process group"]
