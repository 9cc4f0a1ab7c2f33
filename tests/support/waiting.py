"""`eventually`: the one way a test waits for something to come true."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    check: Callable[[], T | Awaitable[T | None] | None],
    timeout: float = 10.0,
    interval: float = 0.02,
) -> T:
    """Ask `check` (plain or async) every `interval` seconds until it answers something other
    than None or False, and return that; `TimeoutError` once `timeout` seconds have passed,
    also when an async `check` itself hangs past them."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    failure = f"{getattr(check, '__name__', check)} not true within {timeout} s"
    while True:
        answer = check()
        if inspect.isawaitable(answer):
            try:
                async with asyncio.timeout_at(deadline):
                    answer = await answer
            except TimeoutError:
                if loop.time() < deadline:
                    raise  # the check's own timeout, not the wait's: its error is the story
                raise TimeoutError(f"{failure} (the check hung)") from None
        if answer is not None and answer is not False:
            return answer  # type: ignore[return-value]
        if loop.time() > deadline:
            raise TimeoutError(failure)
        await asyncio.sleep(interval)
