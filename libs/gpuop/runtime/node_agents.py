"""What every node agent holds and does alike: its bus, its node, its readiness, and the
events it publishes about its node.

The node roles (discovery's `NodeAgent`, network-manager's `NodeAgent`, telemetry's
`NodeExporter`) subclass `NodeAgentBase`; `run` in each service builds one for `--node`.
"""

from __future__ import annotations

from gpuop.bus import Bus
from gpuop.events import Envelope, Event, new_event, subjects
from gpuop.runtime.services import Readiness


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
