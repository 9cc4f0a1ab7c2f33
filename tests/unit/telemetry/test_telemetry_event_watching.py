"""`health.watch` on its own: one waiting thread per open session hands the loop only real
events, in order; the thread ends when the session closes or the watch is cancelled, and a
failed wait is counted, logged and retried after `retry_seconds`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from gpuop.nvml import DeviceEvent, GpuLost, XidEvent
from gpuop.nvml.watching import EventWatcher
from gpuop.services.telemetry import health
from gpuop.services.telemetry.instruments import ExporterMetrics
from gpuop.services.telemetry.sessions import Inventory, NvmlSession
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.waiting import eventually

RETRY_SECONDS = 0.05
THREAD_ENDS_WITHIN = health.EVENT_WAIT_MS / 1000 + 1.0


def waiting_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "nvml-events"]


class Handled:
    """The `handle` given to the watch: what reached the loop, from which session."""

    def __init__(self) -> None:
        self.events: list[tuple[DeviceEvent, Inventory]] = []
        self.threads: set[int] = set()

    async def __call__(self, event: DeviceEvent, session: Inventory) -> None:
        self.threads.add(threading.get_ident())
        self.events.append((event, session))


class FailingOnce:
    """A watcher whose first wait fails as a lost GPU does, then waits as `inner`."""

    def __init__(self, inner: EventWatcher) -> None:
        self.inner = inner
        self.failed_at: float | None = None
        self.waited_again_at: float | None = None

    def wait(self, timeout_ms: int) -> DeviceEvent | None:
        if self.failed_at is None:
            self.failed_at = time.monotonic()
            raise GpuLost("GPU 3 fell off the bus")
        if self.waited_again_at is None:
            self.waited_again_at = time.monotonic()
        return self.inner.wait(timeout_ms)

    def close(self) -> None:
        self.inner.close()


async def ended(thread: threading.Thread) -> bool:
    await asyncio.to_thread(thread.join, THREAD_ENDS_WITHIN)
    return not thread.is_alive()


@pytest.fixture(autouse=True)
async def no_waiting_threads_before() -> None:
    """The threads of watches cancelled in earlier tests end within one wait."""
    for thread in waiting_threads():
        assert await ended(thread)


@pytest.fixture
async def session() -> AsyncIterator[NvmlSession]:
    opened = NvmlSession(SimNvml(4, node="gpu-node-1", holder_id="telemetry"))
    try:
        yield opened
    finally:
        await opened.close()


@contextlib.asynccontextmanager
async def watching(
    session: NvmlSession, handled: Handled, registry: CollectorRegistry
) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(
        health.watch(session, handled, ExporterMetrics(registry), retry_seconds=RETRY_SECONDS)
    )
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def opened(session: NvmlSession) -> Inventory:
    async with session.use() as inventory:
        return inventory


def sim_of(session: NvmlSession) -> SimNvml:
    assert isinstance(session.nvml, SimNvml)
    return session.nvml


async def test_events_reach_the_loop_in_order_from_one_thread_per_session(
    session: NvmlSession,
) -> None:
    handled = Handled()
    async with watching(session, handled, CollectorRegistry()):
        first = await opened(session)
        await eventually(lambda: len(waiting_threads()) == 1)
        sim_of(session).inject_xid(1, 48)
        sim_of(session).inject_xid(2, 79)
        await eventually(lambda: len(handled.events) == 2)
        assert [(e.index, e.xid) for e, _ in handled.events if isinstance(e, XidEvent)] == [
            (1, 48),
            (2, 79),
        ]
        assert all(inventory is first for _, inventory in handled.events)
        assert handled.threads == {threading.get_ident()}, "handled on the loop's thread"
        assert len(waiting_threads()) == 1


async def test_a_closed_session_ends_its_thread_and_the_next_session_gets_a_new_one(
    session: NvmlSession,
) -> None:
    handled = Handled()
    async with watching(session, handled, CollectorRegistry()):
        await opened(session)
        await eventually(lambda: len(waiting_threads()) == 1)
        [before] = waiting_threads()
        await session.close()
        assert await ended(before)

        second = await opened(session)
        await eventually(lambda: len(waiting_threads()) == 1)
        sim_of(session).inject_xid(0, 79)
        await eventually(lambda: len(handled.events) == 1)
        assert handled.events[0][1] is second


async def test_a_cancelled_watch_ends_its_thread_within_one_wait(session: NvmlSession) -> None:
    async with watching(session, Handled(), CollectorRegistry()):
        await opened(session)
        await eventually(lambda: len(waiting_threads()) == 1)
        [thread] = waiting_threads()
    assert await ended(thread)


async def test_a_failed_wait_is_counted_logged_and_retried_after_the_retry_interval(
    session: NvmlSession, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    handled = Handled()
    await opened(session)
    assert session.watcher is not None
    failing = FailingOnce(session.watcher)
    session.watcher = failing
    with caplog.at_level(logging.WARNING, logger=health.__name__):
        async with watching(session, handled, registry):
            await eventually(lambda: failing.waited_again_at is not None)
            sim_of(session).inject_xid(3, 48)
            await eventually(lambda: len(handled.events) == 1)
    assert failing.failed_at is not None and failing.waited_again_at is not None
    assert failing.waited_again_at - failing.failed_at >= RETRY_SECONDS * 0.9
    errors = registry.get_sample_value("gpuop_telemetry_nvml_errors_total", {"query": "events"})
    assert errors == 1
    assert "waiting for NVML events failed: GPU 3 fell off the bus" in caplog.text
