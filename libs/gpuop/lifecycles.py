"""`async with` for the product's long-lived resources, written once.

A resource that is ready once built (the Kubernetes client, a list-watch, an informer)
subclasses `Closable`: leaving its `async with` block closes it. One that must be started
(the health endpoint server, a nats-server process or cluster) subclasses `Startable`:
entering starts it, leaving stops it (its `close` is its `stop`). Either way the block
ends the resource also when its body raises, and the exception goes on.
"""

from __future__ import annotations

import abc
from types import TracebackType
from typing import Self


class Closable(abc.ABC):
    """A resource whose `async with` closes it on the way out."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release what the resource holds."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


class Startable(Closable):
    """A resource whose `async with` starts it on the way in and stops it on the way out."""

    @abc.abstractmethod
    async def start(self) -> object:
        """Start it; what it returns (an address, a URL) is the subclass's."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop it."""

    async def close(self) -> None:
        await self.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self
