"""The test clocks: every one a `gpuop.clocks.VirtualClock`, the one `Clock` of the product.

    VirtualClock   (the product's) sleeps return at once and move time forward
    ManualClock    time moves only when the test calls `advance`; sleepers wait for it
    StillClock     time never moves: a sleep never ends, so no deadline ever fires

The simulated GPUs (`SimNvml`), the telemetry exporter, the simulated API server, the saga
runtime and `gpuop.kube` all take the same `Clock`, so one of these drives any of them.
"""

from __future__ import annotations

import asyncio

from gpuop.clocks import VirtualClock


class ManualClock(VirtualClock):
    """A virtual clock that moves only when the test advances it: sleepers wait for that."""

    async def sleep(self, seconds: float) -> None:
        until = self.monotonic() + max(seconds, 0.0)
        await asyncio.sleep(0)
        while self.monotonic() < until:
            await asyncio.sleep(0.002)


class StillClock(VirtualClock):
    """Virtual time that stays where it started: a sleep on it never ends."""

    async def sleep(self, seconds: float) -> None:
        await asyncio.Event().wait()


__all__ = ["ManualClock", "StillClock", "VirtualClock"]
