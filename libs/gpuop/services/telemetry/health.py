"""GPU health: NVML's XID and ECC events, the kernel log's XIDs, the health signals NVML's
readings show, and GPUs that stop answering, as `device.health-changed` events for the
device plugin and the remediation.

`watch` waits for the events of each NVML session on a thread of that session's own, which
wakes the event loop only for a real event, and hands them to the node exporter, which
passes them, and the outcome of every fast collection, to `marks.HealthTracker`, where
telemetry makes the health decision (one place).

`XidHistory` keeps what `DCGM_FI_DEV_XID_ERRORS` and `DCGM_EXP_XID_ERRORS_COUNT` show.
`Outbox` publishes the events in order and keeps them while the bus is unreachable, so a
node keeps its health history across a NATS outage.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable

from gpuop.bus import Bus, BusError
from gpuop.events import Envelope, new_event
from gpuop.events.device import DeviceHealthChanged, HealthReason
from gpuop.nvml import (
    DeviceEvent,
    EventWatcher,
    NotInitialized,
    NvmlError,
)
from gpuop.services.telemetry.collecting import XidSnapshot
from gpuop.services.telemetry.instruments import ExporterMetrics
from gpuop.services.telemetry.sessions import Inventory, NvmlSession

log = logging.getLogger(__name__)

EVENT_WAIT_MS = 250
"""How long one wait for an NVML event blocks its thread: a cancelled watch has its thread
end within it. A closed session ends the wait sooner (`close()` waits for it)."""
XID_WINDOW_SECONDS = 300.0
"""dcgm-exporter's window for `DCGM_EXP_XID_ERRORS_COUNT`."""
MAX_XIDS_KEPT = 1024
"""XIDs remembered per GPU for the window; a storm beyond that counts only the latest."""
MAX_PENDING_EVENTS = 4096
"""Health events kept while the bus is unreachable; the oldest go first beyond that."""


Handle = Callable[[DeviceEvent, Inventory], Awaitable[None]]
"""Called with each NVML event and the session it came from."""


async def watch(
    session: NvmlSession, handle: Handle, metrics: ExporterMetrics, *, retry_seconds: float
) -> None:
    """Hand every XID and ECC event of every session that opens to `handle`, for ever."""
    seen: Inventory | None = None
    while True:
        seen = await session.opened(other_than=seen)
        if session.watcher is not None:
            await _watch_session(session.watcher, seen, handle, metrics, retry_seconds)


Arrival = DeviceEvent | Exception | None
"""What the waiting thread hands the loop: an event, a failed wait, or None when it ended
(the session closed)."""


async def _watch_session(
    watcher: EventWatcher,
    session: Inventory,
    handle: Handle,
    metrics: ExporterMetrics,
    retry_seconds: float,
) -> None:
    """Hand the events of one session's `watcher` to `handle` until the session closes."""
    # One thread for the session's whole life rather than a thread handoff per wait: an
    # idle node then wakes the loop for no timed-out wait at all (issue 24).
    loop = asyncio.get_running_loop()
    arrivals: asyncio.Queue[Arrival] = asyncio.Queue()
    stop = threading.Event()

    def deliver(arrival: Arrival) -> None:
        if not stop.is_set():
            try:
                loop.call_soon_threadsafe(arrivals.put_nowait, arrival)
            except RuntimeError:  # the loop closed under a cancelled watch
                stop.set()

    threading.Thread(
        target=_wait_for_events,
        args=(watcher, deliver, stop, retry_seconds),
        name="nvml-events",
        daemon=True,  # a wait blocks in C; it must never hold the process up on its way out
    ).start()
    try:
        while (arrival := await arrivals.get()) is not None:
            if isinstance(arrival, NvmlError):
                metrics.nvml_failed("events")
                log.warning("waiting for NVML events failed: %s", arrival)
            elif isinstance(arrival, Exception):
                raise arrival
            else:
                await handle(arrival, session)
    finally:
        stop.set()


def _wait_for_events(
    watcher: EventWatcher,
    deliver: Callable[[Arrival], None],
    stop: threading.Event,
    retry_seconds: float,
) -> None:
    """The waiting thread: every event to `deliver`, until the session closes or `stop`."""
    while not stop.is_set():
        try:
            event = watcher.wait(EVENT_WAIT_MS)
        except NotInitialized:
            break  # the session closed
        except NvmlError as error:
            deliver(error)
            stop.wait(retry_seconds)
            continue
        except Exception as error:
            deliver(error)  # raised in the watch, as it would have been without the thread
            return
        if event is not None:
            deliver(event)
    deliver(None)


class XidHistory:
    """The XIDs seen on each GPU since telemetry started watching."""

    def __init__(self) -> None:
        self._last: dict[int, int] = {}
        self._seen: dict[int, deque[tuple[float, int]]] = {}

    def record(self, index: int, xid: int, now: float) -> None:
        self._last[index] = xid
        self._seen.setdefault(index, deque(maxlen=MAX_XIDS_KEPT)).append((now, xid))

    def snapshot(self, now: float) -> XidSnapshot:
        """What to render now; drops what left the window."""
        counts: dict[int, dict[int, int]] = {}
        for index, seen in self._seen.items():
            while seen and seen[0][0] < now - XID_WINDOW_SECONDS:
                seen.popleft()
            for _, xid in seen:
                per_gpu = counts.setdefault(index, {})
                per_gpu[xid] = per_gpu.get(xid, 0) + 1
        return XidSnapshot(last=dict(self._last), window_counts=counts)


class Outbox:
    """Health events to publish, in order, kept while the bus is unreachable."""

    def __init__(self, bus: Bus, node: str, source: str, metrics: ExporterMetrics) -> None:
        self._bus = bus
        self._node = node
        self._source = source
        self._metrics = metrics
        self._pending: deque[tuple[Envelope, HealthReason]] = deque()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def add(self, change: DeviceHealthChanged) -> None:
        """Queue one event; its id is fixed now, so a retried publish is a duplicate."""
        if len(self._pending) >= MAX_PENDING_EVENTS:
            dropped, _ = self._pending.popleft()
            log.warning("dropping an unpublished health event %s: too many pending", dropped.id)
        envelope = new_event(change, node=self._node, source=self._source)
        self._pending.append((envelope, change.reason))
        self._metrics.health_events_pending.set(len(self._pending))
        log.info(
            "GPU %s %s (%s): %s",
            change.gpu_uuid,
            "healthy" if change.healthy else "unhealthy",
            change.reason,
            change.message,
        )

    async def flush(self) -> bool:
        """Publish what is pending; False when the bus failed and some remain."""
        while self._pending:
            envelope, reason = self._pending[0]
            try:
                await self._bus.publish(envelope)
            except BusError as error:
                log.warning("health event not published yet, retrying: %s", error)
                return False
            self._pending.popleft()
            self._metrics.health_events.labels(reason=reason.value).inc()
            self._metrics.health_events_pending.set(len(self._pending))
        return True
