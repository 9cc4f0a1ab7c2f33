"""A service in this test's process, as `gpuop run` starts it, with its own connection to a
real nats-server; and waiting for what it does.

The services' integration tests (discovery, network-manager, the device plugin, telemetry)
run each role through its `ServiceDefinition.main`, as `runtime.launching.run_service`
does, minus the process, the signals and the health server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from prometheus_client import CollectorRegistry

from gpuop.bus import NatsBus, NatsServer
from gpuop.runtime.services import ServiceContext, ServiceDefinition
from gpuop.runtime.settings import Role, Settings


@asynccontextmanager
async def connected(nats: NatsServer, name: str, retry_for: float = 5.0) -> AsyncIterator[NatsBus]:
    """A connection of its own to `nats`, as each service process has."""
    bus = NatsBus(nats.url, name=name, retry_for=retry_for)
    await bus.start()
    try:
        yield bus
    finally:
        await bus.close()


@asynccontextmanager
async def in_process(
    definition: ServiceDefinition, nats: NatsServer, *, retry_for: float = 5.0, **settings: Any
) -> AsyncIterator[ServiceContext]:
    """`definition` running with `settings` (`Settings` fields) on its own connection to
    `nats`; stopped, awaited and disconnected on the way out."""
    where = settings.get("node") or settings.get("role", Role.NODE)
    async with connected(nats, f"{definition.name}-{where}", retry_for) as bus:
        context = ServiceContext(
            Settings(service=definition.name, nats=(nats.url,), **settings),
            bus,
            CollectorRegistry(),
        )
        task = asyncio.ensure_future(definition.main(context))
        try:
            yield context
        finally:
            context.stopping.set()
            await asyncio.wait_for(task, 10)
