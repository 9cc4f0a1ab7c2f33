"""Telemetry's cluster role: reads the event stream and keeps `OperatorMetrics` current.

`run` (the service's cluster entry point) builds a `ClusterExporter` on the service's
registry. It holds no durable consumer, since its state is only metrics: at every start it
replays the upgrade events and the GPU health events from the beginning of the stream into
the gauges (`live=False`), becomes ready, then follows them, every other event (counted by
domain; driver failures by reason) and the dead letters from that moment on (`live=True`).
A read the bus breaks resumes after the last message it handled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from gpuop.bus import Bus, BusError, StoredMessage
from gpuop.events import (
    MalformedMessage,
    SubjectMismatch,
    UnknownEventType,
    decode_on,
    driver,
    subjects,
)
from gpuop.events.device import DeviceHealthChanged
from gpuop.events.upgrade import DOMAIN as UPGRADE
from gpuop.runtime.services import Readiness, ServiceContext
from gpuop.services.telemetry.config import TelemetryConfig
from gpuop.services.telemetry.operator_metrics import OperatorMetrics

log = logging.getLogger(__name__)

DRIVER = driver.DriverResult.DOMAIN

Handle = Callable[[StoredMessage], None]


class ClusterExporter:
    """The operator metrics of one cluster; see the module docstring."""

    def __init__(
        self,
        bus: Bus,
        registry: CollectorRegistry,
        config: TelemetryConfig,
        *,
        readiness: Readiness | None = None,
    ) -> None:
        self._bus = bus
        self._config = config
        self._readiness = readiness or (lambda ready, reason: None)
        self.metrics = OperatorMetrics(registry)
        prefix = bus.prefix
        self._history = (
            subjects.events_filter(UPGRADE, prefix=prefix),
            subjects.events_filter(
                DeviceHealthChanged.DOMAIN, name=DeviceHealthChanged.NAME, prefix=prefix
            ),
        )
        self._everything = subjects.stream_filter(subjects.Kind.EVENT, prefix=prefix)
        self._dead_letters = subjects.stream_filter(subjects.Kind.DEAD_LETTER, prefix=prefix)

    async def run(self, stopping: asyncio.Event) -> None:
        """Replay the history into the gauges, then follow the stream until `stopping`."""
        started = datetime.now(UTC)
        resume_at = [await self.replay(subject) for subject in self._history]
        self._readiness(True, "")
        async with asyncio.TaskGroup() as group:
            followers = [
                group.create_task(self._follow(subject, since, self._observe))
                for subject, since in zip(self._history, resume_at, strict=True)
            ]
            followers.append(
                group.create_task(self._follow(self._everything, (started, 0), self._count))
            )
            followers.append(
                group.create_task(
                    self._follow(self._dead_letters, (started, 0), self._count_dead_letter)
                )
            )
            await stopping.wait()
            for follower in followers:
                follower.cancel()

    async def replay(self, subject: str) -> tuple[datetime | None, int]:
        """Feed every stored message of `subject` to the gauges; returns where it ended."""
        since: datetime | None = None
        last = 0
        async for stored in self._bus.read(subject):
            self._observe(stored, live=False)
            since, last = stored.time, stored.seq
        return since, last

    async def _follow(
        self,
        subject: str,
        position: tuple[datetime | None, int],
        handle: Callable[..., None],
    ) -> None:
        since, last = position
        while True:
            try:
                async for stored in self._bus.read(subject, since=since, follow=True):
                    if stored.seq <= last:
                        continue  # a resumed read starts at the last one handled
                    handle(stored)
                    since, last = stored.time, stored.seq
            except BusError as error:
                log.warning("reading %s failed, resuming: %s", subject, error)
                await asyncio.sleep(self._config.retry_interval_seconds)

    def _observe(self, stored: StoredMessage, *, live: bool = True) -> None:
        try:
            envelope, payload = decode_on(stored.subject, stored.data)
        except SubjectMismatch as exc:
            # a node's credential may publish on its own subjects only: a type or a node
            # other than the subject's would move another node's gauges
            log.warning("not believed, %s #%d: %s", stored.stream, stored.seq, exc)
            return
        except (MalformedMessage, UnknownEventType):
            return  # counted by whoever consumes it; nothing to measure here
        self.metrics.observe(envelope, payload, live=live)

    def _count(self, stored: StoredMessage) -> None:
        self.metrics.count_event(stored.subject)
        if stored.subject.split(".")[2:3] == [DRIVER]:
            self._observe(stored)  # upgrade and health events have their own readers

    def _count_dead_letter(self, stored: StoredMessage) -> None:
        self.metrics.count_dead_letter(stored.subject, self._bus.prefix)


async def run(context: ServiceContext, config: TelemetryConfig) -> None:
    """The cluster role's entry point: one `ClusterExporter` until the service stops."""
    exporter = ClusterExporter(
        context.bus, context.registry, config, readiness=context.set_readiness
    )
    await exporter.run(context.stopping)
