"""What the node agents' unit tests share: an agent's run loop as a context, commands and
events sent to it as other services send them, and what it published on the in-memory bus.

Used by the support modules of discovery's and telemetry's tests, which add their own
simulated node.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol, TypeVar

from gpuop.bus import InMemoryBus
from gpuop.events import Event, decode, new_command, new_event
from gpuop.events.envelope import Command, Envelope

NODE = "gpu-1.example.com"
"""The simulated node every node agent's unit test runs on."""

E = TypeVar("E", bound=Event)


class NodeAgent(Protocol):
    """A node role's agent: runs until `stopping` is set."""

    async def run(self, stopping: asyncio.Event) -> None: ...


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
    """Publish `command` to the agents on `NODE`, as the orchestrator does."""
    envelope = new_command(command, node=NODE, source="/gpuop/test", id=id)
    await bus.publish(envelope)
    return envelope


async def send_event(bus: InMemoryBus, event: Event, correlationid: str | None = None) -> Envelope:
    """Publish `event` about `NODE`, as another service does."""
    envelope = new_event(event, node=NODE, source="/gpuop/test", correlationid=correlationid)
    await bus.publish(envelope)
    return envelope
