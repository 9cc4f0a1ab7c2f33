"""Helpers for bus tests: envelopes, raw publishing, and a handler that records."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from gpuop.bus import Bus, Delivery
from gpuop.bus.protocol import StoredMessage
from gpuop.events import Envelope, new_event
from gpuop.events.hardware import HardwareHeartbeat
from tests.support.waiting import eventually

BOOT_ID = "6f0e6b1c-3a52-4b8e-9a1d-0c5c2f3e4d5a"
HASH = "a" * 64


def heartbeat(node: str, n: int, *, id: str | None = None) -> Envelope:
    """A small real event; `n` rides in `uptime_seconds` so tests can check order."""
    payload = HardwareHeartbeat(boot_id=BOOT_ID, inventory_hash=HASH, uptime_seconds=n, gpu_count=8)
    return new_event(payload, node=node, source="/gpuop/test", id=id)


def seq_of(delivery: Delivery) -> int:
    assert isinstance(delivery.payload, HardwareHeartbeat)
    return int(delivery.payload.uptime_seconds)


HB_SUBJECT = "gpuop.evt.hardware.*.heartbeat"


@dataclass
class Recorder:
    """A handler that records deliveries and can be told to fail."""

    behaviour: Callable[[Delivery], Awaitable[None]] | None = None
    seen: list[Delivery] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def __call__(self, delivery: Delivery) -> None:
        async with self.changed:
            self.seen.append(delivery)
            self.changed.notify_all()
        if self.behaviour is not None:
            await self.behaviour(delivery)

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[Delivery]:
        async with asyncio.timeout(timeout), self.changed:
            await self.changed.wait_for(lambda: len(self.seen) >= count)
        return list(self.seen)


async def publish_raw(bus: Bus, subject: str, data: bytes, msg_id: str | None = None) -> None:
    """Publish bytes that no model produced (malformed or hostile input)."""
    await bus.publish_raw(subject, data, {"Nats-Msg-Id": msg_id} if msg_id else None)


async def collect(
    iterator: AsyncIterator[StoredMessage], timeout: float = 5.0
) -> list[StoredMessage]:
    out = []
    async with asyncio.timeout(timeout):
        async for item in iterator:
            out.append(item)
    return out


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """`eventually`, for a check that answers a bool."""
    await eventually(predicate, timeout)


async def dead_letters(bus: Bus) -> list[StoredMessage]:
    return await collect(bus.read(f"{bus.prefix}.dlq.>"))
