"""A list-watch read in the background, so that several readers share one LIST and one WATCH.

A `ListWatch` is an iterator: one reader takes each change. An `Informer` (client-go's name
for the same idea) lists once for all its readers (`synced`), then takes every change in a
task of its own, keeping the collection's objects current; readers look at `objects` and
wait for the next change with `changed`. The upgrade orchestrator keeps one per node
whose saga is in the steps that need the node's pods (waiting for jobs, deleting GPU pods,
draining: `draining.drain_node` takes one), so those steps cost one LIST and one WATCH
together instead of one each.

A failure the list-watch does not recover from itself (it retries temporary ones) ends the
informer: `changed` raises it to every reader, and `failed` tells its owner to start anew.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

from gpuop import lifecycles
from gpuop.kube.watching import ListWatch, Obj, ObjectKey


class Informer(lifecycles.Closable):
    """One `ListWatch`, read by a background task, shared by many readers."""

    def __init__(self, watch: ListWatch) -> None:
        self._watch = watch
        self._listing = asyncio.Lock()
        self._reader: asyncio.Task[None] | None = None
        self._version = 0
        self._wakeup = asyncio.Event()
        self._failure: BaseException | None = None

    @property
    def objects(self) -> Mapping[ObjectKey, Obj]:
        """The last known state of every object."""
        return self._watch.objects

    @property
    def version(self) -> int:
        """Counts the changes received; pass it to `changed` to wait for a later one."""
        return self._version

    @property
    def failed(self) -> bool:
        """The informer stopped following the collection (an error, or closed)."""
        return self._failure is not None

    async def synced(self) -> Mapping[ObjectKey, Obj]:
        """List the collection and start following it, unless that was done; return every
        object. Readers arriving while the LIST runs share it; a failed LIST raises its
        `KubeError` (and the next reader tries again)."""
        if self._failure is not None:
            raise self._failure
        async with self._listing:
            if self._reader is None:
                await self._watch.list()
                if self._failure is not None:
                    raise self._failure  # closed while listing
                self._reader = asyncio.create_task(self._read(), name="informer")
        return self.objects

    async def changed(self, since: int) -> None:
        """Return once a change after `version` `since` was received; raises the failure
        that ended the informer."""
        await self.synced()
        while self._version <= since:
            if self._failure is not None:
                raise self._failure
            await self._wakeup.wait()

    async def _read(self) -> None:
        try:
            async for _ in self._watch:
                self._version += 1
                self._wake()
        except Exception as error:
            self._failure = error
        else:
            self._failure = RuntimeError("the informer was closed")
        finally:
            self._wake()

    def _wake(self) -> None:
        self._wakeup.set()
        self._wakeup = asyncio.Event()

    async def close(self) -> None:
        """Stop following the collection and release the connection."""
        if self._failure is None:
            self._failure = RuntimeError("the informer was closed")
        await self._watch.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        self._wake()
