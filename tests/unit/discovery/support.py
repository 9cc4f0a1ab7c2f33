"""Helpers for discovery's node agent tests: an NVML that counts sessions, the agent's run
loop as a context, and reading what it published on the in-memory bus."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from gpuop.bus import InMemoryBus
from gpuop.events import Event, decode, new_command, new_event
from gpuop.events.envelope import Command, Envelope
from gpuop.services.discovery.config import DiscoveryConfig
from gpuop.services.discovery.node_agent import NodeAgent

NODE = "gpu-1.example.com"
BOOT_ID = "8c1f2f5e-0c53-4d57-a0a4-3e3c1b0c9a11"
QUIET = DiscoveryConfig(
    scan_interval_seconds=3600, heartbeat_interval_seconds=3600, retry_interval_seconds=0.05
)
"""Intervals long enough that only what a test does makes the agent act."""

E = TypeVar("E", bound=Event)


class CountingNvml:
    """An NVML backend that counts the sessions opened on it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sessions = 0

    def init(self) -> None:
        self.sessions += 1
        self.inner.init()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@asynccontextmanager
async def running(agent: NodeAgent) -> AsyncIterator[None]:
    """The agent's whole run loop, stopped and awaited on the way out."""
    stopping = asyncio.Event()
    task = asyncio.create_task(agent.run(stopping))
    try:
        yield
    finally:
        stopping.set()
        await asyncio.wait_for(task, 5)


async def published(bus: InMemoryBus, kind: type[E]) -> list[tuple[Envelope, E]]:
    """Every event of `kind` on the bus so far, in order."""
    found = []
    async for stored in bus.read(f"{bus.prefix}.evt.>"):
        envelope, payload = decode(stored.data)
        if isinstance(payload, kind):
            found.append((envelope, payload))
    return found


async def wait_for(
    bus: InMemoryBus, kind: type[E], count: int, timeout: float = 5.0
) -> list[tuple[Envelope, E]]:
    """Wait until at least `count` events of `kind` were published; return them all."""
    async with asyncio.timeout(timeout):
        while len(found := await published(bus, kind)) < count:
            await asyncio.sleep(0.01)
    return found


async def send_command(bus: InMemoryBus, command: Command, id: str) -> Envelope:
    envelope = new_command(command, node=NODE, source="/gpuop/test", id=id)
    await bus.publish(envelope)
    return envelope


async def send_event(bus: InMemoryBus, event: Event, correlationid: str | None = None) -> Envelope:
    envelope = new_event(event, node=NODE, source="/gpuop/test", correlationid=correlationid)
    await bus.publish(envelope)
    return envelope
