"""A stopping service gets a grace period to return by itself, then is cancelled; what it
raises on its own is still raised."""

from __future__ import annotations

import asyncio

import pytest

from gpuop.runtime import launching


@pytest.fixture(autouse=True)
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launching, "MAIN_GRACE", 0.05)


async def test_work_that_ignores_the_stop_is_cancelled_after_the_grace() -> None:
    stopping = asyncio.Event()
    cancelled = asyncio.Event()

    async def stuck() -> None:  # a publish waiting for a NATS that is gone
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    running = asyncio.create_task(launching.run_until_stopped(stuck(), stopping))
    await asyncio.sleep(0.01)
    assert not running.done()
    stopping.set()

    await asyncio.wait_for(running, 5)
    assert cancelled.is_set()


async def test_work_that_returns_on_the_stop_is_not_cancelled() -> None:
    stopping = asyncio.Event()
    finished: list[str] = []

    async def polite() -> None:
        await stopping.wait()
        await asyncio.sleep(0.01)  # its own cleanup, within the grace
        finished.append("cleaned up")

    stopping.set()
    await launching.run_until_stopped(polite(), stopping)
    assert finished == ["cleaned up"]


async def test_an_error_of_the_work_is_raised() -> None:
    async def broken() -> None:
        raise RuntimeError("cannot connect")

    with pytest.raises(RuntimeError, match="cannot connect"):
        await launching.run_until_stopped(broken(), asyncio.Event())


async def test_cancelling_the_runner_cancels_the_work() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            cancelled.set()

    running = asyncio.create_task(launching.run_until_stopped(work(), asyncio.Event()))
    await started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert cancelled.is_set()
