"""How a service's loops wait between passes: a period, cut short by a stop or a wake-up.

The node agents and cluster controllers work in passes (scan, converge, reconcile, collect,
retry) and wait in between with `idle`, which a wake-up event (a command, a watched change)
or the service stopping cuts short. A loop that nothing wakes early waits with
`stopped_within`.
"""

from __future__ import annotations

import asyncio


async def stopped_within(stopping: asyncio.Event, seconds: float) -> bool:
    """Wait up to `seconds` for `stopping`; whether it was set."""
    try:
        await asyncio.wait_for(stopping.wait(), seconds)
    except TimeoutError:
        return False
    return True


async def idle(
    seconds: float | None, *, wake: asyncio.Event, stopping: asyncio.Event | None = None
) -> None:
    """Wait `seconds` (forever with None), or less when `wake` or `stopping` is set, then
    clear `wake`: a wake-up set during the pass before ends the wait at once."""
    waiters = [asyncio.create_task(wake.wait())]
    if stopping is not None:
        waiters.append(asyncio.create_task(stopping.wait()))
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
    wake.clear()
