"""What every node agent holds and does alike: its bus, its node, its readiness, and the
events it publishes about its node.

The node roles (discovery's `NodeAgent`, network-manager's `NodeAgent`, telemetry's
`NodeExporter`) subclass `NodeAgentBase`; `run` in each service builds one for `--node`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Protocol

from gpuop.bus import Bus, ConsumerSpec, Subscription
from gpuop.bus.protocol import Handler
from gpuop.events import Envelope, Event, new_event, subjects
from gpuop.runtime.services import Readiness


class NodeConsumer(Protocol):
    """A service's consumer of one node's messages (`consumers.node_commands` and alike)."""

    def __call__(self, prefix: str, node: str, *, retry_delay: float) -> ConsumerSpec: ...


def _unreported(ready: bool, reason: str) -> None:
    """Readiness nobody asked for (an agent built by a test)."""


class NodeAgentBase:
    """One service's agent on one node."""

    def __init__(self, bus: Bus, service: str, node: str, readiness: Readiness | None) -> None:
        self._bus = bus
        self._node = subjects.validate_node_name(node)
        """This node's Kubernetes name; a name no subject can carry is refused here."""
        self._readiness = readiness or _unreported
        self._source = f"/gpuop/{service}/{node}"
        """The CloudEvents `source` of every event the agent publishes."""

    async def _publish(self, payload: Event, *, cause: Envelope | None = None) -> None:
        """Publish `payload` about this node; `cause` is the message it answers."""
        await self._bus.publish(
            new_event(payload, node=self._node, source=self._source, cause=cause)
        )

    @contextlib.asynccontextmanager
    async def _consuming(
        self, *consumers: tuple[NodeConsumer, Handler], retry_delay: float
    ) -> AsyncIterator[None]:
        """Consume this node's messages with each (consumer, handler) while the block runs;
        the subscriptions stop after it (also those made before one that failed to start),
        in the order they started."""
        subscriptions: list[Subscription] = []
        try:
            for consumer, handler in consumers:
                spec = consumer(self._bus.prefix, self._node, retry_delay=retry_delay)
                subscriptions.append(await self._bus.consume(spec, handler))
            yield
        finally:
            for subscription in subscriptions:
                await subscription.stop()
