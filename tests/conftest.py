"""Fixtures shared by every suite: a real nats-server per test, and a check for leaked tasks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuop.bus import NatsServer


@pytest.fixture
async def nats_server(tmp_path: Path) -> AsyncIterator[NatsServer]:
    """A fresh JetStream server on loopback with its store under the test's tmp dir."""
    server = NatsServer(tmp_path / "nats")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves asyncio tasks running: they would act after it ended."""
    before = set(asyncio.all_tasks())
    yield
    leaked: list[asyncio.Task[object]] = []
    for _ in range(50):  # client libraries finish their own tasks a moment after close
        leaked = [
            t
            for t in asyncio.all_tasks() - before
            if not t.done() and t is not asyncio.current_task()
        ]
        if not leaked:
            break
        await asyncio.sleep(0.01)
    for task in leaked:
        task.cancel()
    await asyncio.gather(*leaked, return_exceptions=True)
    assert not leaked, f"test leaked tasks: {[t.get_name() for t in leaked]}"
