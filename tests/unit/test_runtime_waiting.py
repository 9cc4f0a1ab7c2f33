"""The service loops' waits: a period, cut short by the service stopping or a wake-up."""

from __future__ import annotations

import asyncio

from gpuop.runtime import waiting


async def test_stopped_within_says_whether_the_service_stopped() -> None:
    stopping = asyncio.Event()

    assert await waiting.stopped_within(stopping, 0.01) is False
    stopping.set()
    assert await waiting.stopped_within(stopping, 60) is True


async def test_idle_ends_at_a_wake_up_even_one_set_before_and_clears_it() -> None:
    wake, stopping = asyncio.Event(), asyncio.Event()
    wake.set()

    await asyncio.wait_for(waiting.idle(60, wake=wake, stopping=stopping), 5)

    assert not wake.is_set()
    asyncio.get_running_loop().call_later(0.01, wake.set)
    await asyncio.wait_for(waiting.idle(None, wake=wake), 5)
    assert not wake.is_set()


async def test_idle_ends_when_stopping_or_after_its_period() -> None:
    wake, stopping = asyncio.Event(), asyncio.Event()

    await asyncio.wait_for(waiting.idle(0.01, wake=wake, stopping=stopping), 5)
    stopping.set()
    await asyncio.wait_for(waiting.idle(60, wake=wake, stopping=stopping), 5)

    assert stopping.is_set()
