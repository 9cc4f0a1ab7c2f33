"""The one way the orchestrator publishes: under its `SOURCE`, stamped by its clock.

Every component that publishes (the outbox, the runner, the controller, deadlines, the Node
and pod observers, the rollout reporter) holds a `Publisher` over the bus and the clock it
was given, and says only what differs: the payload, the node, the id (`gpuop.events.ids`),
and the links (correlation, causation, trace).

Every message here is published as a possible re-publish (`republish=True`): the ids are
derived from the saga (`gpuop.events.ids`) so that a step re-issued after a crash, a
redelivery or a leader takeover is stored once, and a duplicate answer is then the earlier
copy. That is no squat: the ids are keyed by the orchestrator's own NATS credential
(`gpuop.bus.publishing.message_id`), which no other user holds.
"""

from __future__ import annotations

from datetime import datetime

from gpuop.bus import Bus, PublishAck
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events import Command, Event, new_command, new_event

SOURCE = "/gpuop/upgrade-orchestrator"
"""The `source` of every message the orchestrator publishes."""


class Publisher:
    """Publishes the orchestrator's events and commands on `bus`, at `clock`'s time."""

    def __init__(self, bus: Bus, clock: Clock = SYSTEM_CLOCK) -> None:
        self.bus = bus
        self._clock = clock

    async def event(
        self,
        payload: Event,
        *,
        node: str,
        id: str | None = None,
        correlationid: str | None = None,
        causationid: str | None = None,
        traceparent: str | None = None,
        now: datetime | None = None,
    ) -> PublishAck:
        """Publish `payload` about `node` (`now`: its time, default the clock's)."""
        return await self.bus.publish(
            new_event(
                payload,
                node=node,
                source=SOURCE,
                id=id,
                correlationid=correlationid,
                causationid=causationid,
                traceparent=traceparent,
                now=now or self._clock.now(),
            ),
            republish=True,
        )

    async def command(
        self,
        payload: Command,
        *,
        node: str,
        id: str,
        correlationid: str | None = None,
        traceparent: str | None = None,
    ) -> PublishAck:
        """Publish `payload` for the agent on `node` under its deterministic `id`."""
        return await self.bus.publish(
            new_command(
                payload,
                node=node,
                source=SOURCE,
                id=id,
                correlationid=correlationid,
                traceparent=traceparent,
                now=self._clock.now(),
            ),
            republish=True,
        )
