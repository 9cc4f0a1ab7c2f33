"""`async with` for the product's long-lived resources, written once.

A resource that is ready once built (the Kubernetes client, a list-watch, an informer)
subclasses `Closable`: leaving its `async with` block closes it; one whose `close` is
synchronous (a directory watch, a socket's directory descriptor) subclasses `Closing`, for
a plain `with`. One that must be started
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


class Closing(abc.ABC):
    """A resource with a synchronous `close`, which its `with` calls on the way out."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the resource holds; safe to call twice."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
