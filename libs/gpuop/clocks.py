"""Time, as a dependency of everything in gpuop that waits: the one clock.

Drain timeouts, eviction retries, watch backoffs, lease expiry and the node agents' polls
read `monotonic()` and wait with `sleep()`; lease and event timestamps come from `now()`.
Callers pass a clock to the functions and objects that wait; the default is
`SYSTEM_CLOCK`. Tests pass a `VirtualClock`, whose sleeps return at once and move its time
forward, so a 300 s drain timeout takes milliseconds.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """Monotonic time, sleeping and the wall clock: what everything that waits or stamps takes
    (`gpuop.kube`'s retries, informers and leases, the services' timers and deadlines), so a
    test can pass a `VirtualClock`."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; only differences mean anything."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` (at least one pass of the event loop, even for 0)."""
        ...

    def now(self) -> datetime:
        """The wall-clock time in UTC, for timestamps written to the API server."""
        ...


class SystemClock:
    """The real clocks of this machine."""

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0))

    def now(self) -> datetime:
        return datetime.now(UTC)


class VirtualClock:
    """A clock that only moves when slept on or advanced: sleeps return after one pass of
    the event loop. Concurrent sleepers each move it forward, so time runs at least as
    fast as they wait; that keeps every deadline honest while tests stay fast."""

    def __init__(self, start: datetime | None = None) -> None:
        self._start = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._elapsed = 0.0

    def monotonic(self) -> float:
        return self._elapsed

    async def sleep(self, seconds: float) -> None:
        self.advance(seconds)
        await asyncio.sleep(0)

    def now(self) -> datetime:
        return self._start + timedelta(seconds=self._elapsed)

    def advance(self, seconds: float) -> None:
        self._elapsed += max(seconds, 0.0)


SYSTEM_CLOCK: Clock = SystemClock()
"""The default clock of every helper in this package."""
