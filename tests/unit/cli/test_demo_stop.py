"""A stopping signal ends the demo's wait in progress, even when the work swallows the first
cancellation (as Python 3.11's `wait_for` does when a result races it)."""

from __future__ import annotations

import asyncio
import signal

import pytest

from gpuop_sim.cli.processes import Stop, Stopped


async def test_work_that_finishes_gives_its_result() -> None:
    async def work() -> int:
        return 7

    assert await Stop().unless_stopped(work()) == 7


async def test_a_signal_stops_work_that_swallows_the_first_cancellation() -> None:
    stop = Stop()
    cancellations = 0

    async def stubborn() -> None:
        nonlocal cancellations
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancellations += 1
                if cancellations > 1:
                    raise

    waiting = asyncio.create_task(stop.unless_stopped(stubborn()))
    await asyncio.sleep(0.01)
    stop._on_signal(signal.SIGTERM)
    with pytest.raises(Stopped) as stopped:
        await asyncio.wait_for(waiting, 5)
    assert stopped.value.signum is signal.SIGTERM and cancellations == 2


async def test_a_signal_before_the_wait_stops_it_at_once() -> None:
    stop = Stop()
    stop._on_signal(signal.SIGHUP)
    stop._on_signal(signal.SIGTERM)  # later ones change nothing
    with pytest.raises(Stopped) as stopped:
        await stop.unless_stopped(asyncio.sleep(3600))
    assert stopped.value.signum is signal.SIGHUP
