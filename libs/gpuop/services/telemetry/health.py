"""GPU health: NVML's XID and ECC events, and GPUs that stop answering, as
`device.health-changed` events for the device plugin and the remediation.

`watch` waits for the events of each NVML session on a thread of that session's own, which
wakes the event loop only for a real event, and hands them to the node exporter, which
passes them, and the outcome of every fast collection, to `HealthTracker`. Telemetry owns
the health decision (one place): the tracker decides what changed and what the fault asks
for, and every event it makes carries that `XidAction`:

- an XID gets the action gpuop's XID catalog (`gpuop.health.xids`) gives it. An action of
  `none` or `restart-application` (the XIDs an application causes, or informational ones)
  keeps the GPU healthy and only shows in the metrics; any other makes the GPU unhealthy
  (reason `xid`). An XID in `ignored_xids` never changes health, whatever the catalog says:
  an explicit ignore list wins. Its default is the NVIDIA device plugin's list, so XID 109,
  which the catalog resets, stays ignored as upstream ignores it; `ignored_xids: []` leaves
  the decision to the catalog alone;
- an uncorrectable ECC event makes the GPU unhealthy (reason `ecc`, action `reset-gpu`: a
  reset retires the bad page, or activates the row remap it left pending), with the counters
  of the collection that followed; corrected errors only count in the metrics;
- a GPU the fast queries cannot reach is unhealthy (`unreachable`, action `reboot`: a reset
  goes through the driver to a GPU it can reach, so one that fell off the bus or lost its
  handle needs the node rebooted, as the catalog's `RESTART_BM` for XID 79) until it
  answers again;
- while a GPU is unhealthy, a further fault never lowers the action: each event carries the
  strongest action the GPU's mark has seen (`reboot` after 79 stays `reboot` on a later 48);
- an XID or ECC mark holds until the GPU answers in a later NVML session (after the driver
  reload a pause and resume bring, or a reset) with no uncorrected volatile ECC error nor
  pending row remap; then the GPU is `recovered` (action `none`).

`XidHistory` keeps what `DCGM_FI_DEV_XID_ERRORS` and `DCGM_EXP_XID_ERRORS_COUNT` show.
`Outbox` publishes the events in order and keeps them while the bus is unreachable, so a
node keeps its health history across a NATS outage.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

from gpuop.bus import Bus, BusError
from gpuop.events import Envelope, new_event
from gpuop.events.device import DeviceHealthChanged, HealthReason, XidAction
from gpuop.health import ignores, xids
from gpuop.nvml import (
    DeviceEvent,
    DeviceMetrics,
    EccEvent,
    EventWatcher,
    NotInitialized,
    NvmlError,
    XidEvent,
)
from gpuop.services.telemetry.collecting import FastRound, XidSnapshot
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
MAX_EVENT_COUNT = 1_000_000
"""The most an event's ECC counts carry (`fields.Count`)."""
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


@dataclass(frozen=True, slots=True)
class _Mark:
    reason: HealthReason
    session: Inventory
    """The NVML session in which the GPU became unhealthy."""
    action: XidAction
    """The strongest action the faults since then asked for."""


class HealthTracker:
    """Decides when a GPU's health changed and what it asks for; see the module docstring."""

    def __init__(
        self, ignored_xids: Collection[int], catalog: xids.XidCatalog | None = None
    ) -> None:
        self._ignored = frozenset(ignored_xids)
        self._catalog = catalog or xids.packaged()
        self._marks: dict[str, _Mark] = {}

    def unhealthy(self) -> dict[str, HealthReason]:
        """The GPUs marked unhealthy now, by UUID."""
        return {uuid: mark.reason for uuid, mark in self._marks.items()}

    def actions(self) -> dict[str, XidAction]:
        """What each GPU marked unhealthy now asks for, by UUID."""
        return {uuid: mark.action for uuid, mark in self._marks.items()}

    def xid_action(self, xid: int) -> XidAction | None:
        """What `xid` asks for; None when `ignored_xids` lists it."""
        return None if ignores(self._ignored, xid) else self._catalog.action(xid)

    def _mark(
        self, uuid: str, reason: HealthReason, session: Inventory, action: XidAction
    ) -> XidAction:
        """Mark the GPU unhealthy; returns the action it now asks for, never lower than
        what its current mark asked."""
        previous = self._marks.get(uuid)
        if previous is not None and previous.action.rank > action.rank:
            action = previous.action
        self._marks[uuid] = _Mark(reason, session, action)
        return action

    def on_event(
        self, event: DeviceEvent, session: Inventory, last: FastRound | None
    ) -> DeviceHealthChanged | None:
        """The health change an NVML event means, if any; `last` is the collection that
        followed it."""
        if isinstance(event, XidEvent):
            asked = self.xid_action(event.xid)
            if asked is None or asked.keeps_gpu_healthy:
                return None
            action = self._mark(event.uuid, HealthReason.XID, session, asked)
            return DeviceHealthChanged(
                gpu_uuid=event.uuid,
                healthy=False,
                reason=HealthReason.XID,
                xid=event.xid,
                action=action,
                message=f"{self._catalog.describe(event.xid)} on GPU {event.index}: {action}",
            )
        if isinstance(event, EccEvent) and event.uncorrectable:
            metrics = last.metrics.get(event.index) if last else None
            action = self._mark(event.uuid, HealthReason.ECC, session, XidAction.RESET_GPU)
            pending = " (row remap pending)" if metrics and metrics.remapped_rows_pending else ""
            return DeviceHealthChanged(
                gpu_uuid=event.uuid,
                healthy=False,
                reason=HealthReason.ECC,
                ecc_volatile_uncorrected=_count(
                    metrics.ecc_volatile_uncorrected if metrics else None
                ),
                ecc_aggregate_uncorrected=_count(
                    metrics.ecc_aggregate_uncorrected if metrics else None
                ),
                action=action,
                message=f"uncorrectable ECC error on GPU {event.index}{pending}: {action}",
            )
        return None

    def on_round(self, session: Inventory, collected: FastRound) -> list[DeviceHealthChanged]:
        """The health changes one fast collection shows: GPUs lost, GPUs back."""
        changes: list[DeviceHealthChanged] = []
        for gpu in session.gpus:
            mark = self._marks.get(gpu.uuid)
            error = collected.failures.get(gpu.index)
            if error is not None:
                if mark is None or mark.reason is not HealthReason.UNREACHABLE:
                    action = self._mark(
                        gpu.uuid, HealthReason.UNREACHABLE, session, XidAction.REBOOT
                    )
                    changes.append(
                        DeviceHealthChanged(
                            gpu_uuid=gpu.uuid,
                            healthy=False,
                            reason=HealthReason.UNREACHABLE,
                            action=action,
                            message=f"GPU {gpu.index} does not answer NVML: {error}"[:1024],
                        )
                    )
                continue
            metrics = collected.metrics.get(gpu.index)
            if mark is not None and metrics is not None and _recovered(mark, session, metrics):
                del self._marks[gpu.uuid]
                changes.append(
                    DeviceHealthChanged(
                        gpu_uuid=gpu.uuid,
                        healthy=True,
                        reason=HealthReason.RECOVERED,
                        action=XidAction.NONE,
                        ecc_volatile_uncorrected=_count(metrics.ecc_volatile_uncorrected),
                        ecc_aggregate_uncorrected=_count(metrics.ecc_aggregate_uncorrected),
                        message=f"GPU {gpu.index} answers again after {mark.reason}",
                    )
                )
        return changes


def _count(value: int | None) -> int | None:
    # the event's counts are bounded; a GPU past a million errors is past caring
    return None if value is None else min(value, MAX_EVENT_COUNT)


def _recovered(mark: _Mark, session: Inventory, metrics: DeviceMetrics) -> bool:
    if mark.reason is HealthReason.UNREACHABLE:
        return True
    if mark.session is session:
        return False  # XID and ECC marks hold until a driver reload
    return not metrics.ecc_volatile_uncorrected and not metrics.remapped_rows_pending


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
