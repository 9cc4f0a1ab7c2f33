"""GPU health events as NVML delivers them: XID errors and ECC errors.

Telemetry opens one `EventWatcher` per session with `Nvml.watch_events()` and turns what it
returns into `device.health-changed` events, which the device plugin consumes. `wait()`
blocks in C for up to its timeout, like `nvmlEventSetWait`, so call it from a dedicated
thread (`asyncio.to_thread`) with a short timeout (a few hundred ms) and loop: `close()`
waits for an ongoing `wait()` to return before it frees the event set.

An event reaches only watchers open when it happens; the counters in `DeviceMetrics`
(ECC, remapped rows) are what survives in between. `QueueWatcher` is the in-memory watcher
the simulated and recorded backends hand out; `WatcherSet` is how every backend keeps track
of its open watchers, to close them on `shutdown()`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from gpuop.nvml.errors import NotInitialized

NOT_MIG = 0xFFFFFFFF
"""What NVML puts in an event's GPU and compute instance ids when the GPU is not in MIG mode."""


@dataclass(frozen=True, slots=True)
class XidEvent:
    """The driver reported a critical XID error on a GPU (`nvmlEventTypeXidCriticalError`)."""

    index: int
    """NVML index of the GPU."""
    uuid: str
    """UUID of the GPU."""
    xid: int
    """The XID: 48 is a double-bit ECC error, 79 a GPU fallen off the bus, 13 an app fault."""
    gpu_instance_id: int | None
    """MIG GPU instance the error hit; `None` when not in MIG mode or not attributable."""
    compute_instance_id: int | None
    """MIG compute instance the error hit; `None` when not in MIG mode or not attributable."""


@dataclass(frozen=True, slots=True)
class EccEvent:
    """The GPU counted an ECC error (`nvmlEventTypeSingleBitEccError` / `DoubleBitEccError`)."""

    index: int
    """NVML index of the GPU."""
    uuid: str
    """UUID of the GPU."""
    uncorrectable: bool
    """True for a double-bit (uncorrectable) error, False for a corrected single-bit one."""


DeviceEvent = XidEvent | EccEvent
"""Anything `EventWatcher.wait()` returns."""


class EventWatcher(Protocol):
    """A registration for XID and ECC events on some GPUs, from `Nvml.watch_events()`."""

    def wait(self, timeout_ms: int) -> DeviceEvent | None:
        """The next event, blocking up to `timeout_ms`; `None` when none arrived in time.

        Raises `errors.NotInitialized` once the watcher or its session is closed, and
        `errors.GpuLost` when a watched GPU stopped answering.
        """
        ...

    def close(self) -> None:
        """Stop watching and free the registration; safe to call twice."""
        ...


def instance_id(raw: int) -> int | None:
    """An event's MIG instance id, `None` for NVML's not-in-MIG marker."""
    return None if raw == NOT_MIG else raw


class QueueWatcher:
    """An `EventWatcher` fed by `deliver()` from any thread; `wait()` blocks on a condition."""

    def __init__(
        self,
        indices: Collection[int],
        on_close: Callable[[QueueWatcher], None] | None = None,
    ) -> None:
        self.indices = frozenset(indices)
        """The GPUs this watcher registered for."""
        self._events: deque[DeviceEvent] = deque()
        self._ready = threading.Condition()
        self._closed = False
        self._on_close = on_close

    def deliver(self, event: DeviceEvent) -> None:
        """Queue an event for `wait()` when it concerns a watched GPU."""
        if event.index not in self.indices:
            return
        with self._ready:
            if not self._closed:
                self._events.append(event)
                self._ready.notify_all()

    def wait(self, timeout_ms: int) -> DeviceEvent | None:
        with self._ready:
            self._ready.wait_for(lambda: self._events or self._closed, timeout_ms / 1000)
            if self._closed:
                raise NotInitialized("the event watcher is closed")
            return self._events.popleft() if self._events else None

    def close(self) -> None:
        with self._ready:
            if self._closed:
                return
            self._closed = True
            self._events.clear()
            self._ready.notify_all()
        if self._on_close is not None:
            self._on_close(self)


W = TypeVar("W", bound=EventWatcher)


class WatcherSet(Generic[W]):
    """The open watchers of one session; watchers leave it from any thread as they close."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[W] = set()

    def add(self, watcher: W) -> W:
        with self._lock:
            self._open.add(watcher)
        return watcher

    def discard(self, watcher: W) -> None:
        with self._lock:
            self._open.discard(watcher)

    def snapshot(self) -> list[W]:
        """The watchers open now."""
        with self._lock:
            return list(self._open)

    def close_all(self) -> None:
        for watcher in self.snapshot():
            watcher.close()
