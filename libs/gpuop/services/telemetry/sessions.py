"""The node exporter's hold on NVML: opened when first needed, closed for a pause.

The fast collection, the slow queries and the XID/ECC event watcher share one `NvmlSession`.
Each query round runs inside `use()`, which opens the session when it is closed and counts
the round as a user; `close()` refuses new rounds, waits for the running ones (a slow round
blocks in NVML for up to a few hundred milliseconds), then shuts NVML down in a thread,
which also ends the event watcher. So a pause never pulls the session from under a query,
and after it nothing of telemetry holds `/dev/nvidia*`.

What a session knows of the node (`Inventory`) is read once when it opens: GPU identities,
the driver version, MIG devices; they do not change while the driver stays loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from gpuop.nvml import DeviceInfo, EventWatcher, MigDevice, NotSupported, Nvml, NvmlError, inventory

log = logging.getLogger(__name__)


class SessionClosed(Exception):
    """NVML is off limits: the operands are paused."""


@dataclass(frozen=True, slots=True)
class Inventory:
    """What an open session read of the node when it opened."""

    driver_version: str
    gpus: tuple[DeviceInfo, ...]
    migs: tuple[MigDevice, ...]


class NvmlSession:
    """One NVML session shared by telemetry's loops; see the module docstring."""

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml
        self.inventory: Inventory | None = None
        """What the open session read; None while closed."""
        self.watcher: EventWatcher | None = None
        """XID and ECC events of the open session; None while closed or not supported."""
        self.allowed = True
        """False while paused (`pause()` to `resume()`): `use()` raises `SessionClosed`."""
        self._transition = asyncio.Lock()
        self._idle = asyncio.Condition()
        self._users = 0
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def use(self) -> AsyncIterator[Inventory]:
        """The open session's inventory, opening it first when needed, for one round of
        queries. Raises `SessionClosed` while paused and `NvmlError` when NVML cannot open."""
        async with self._transition:
            if not self.allowed:
                raise SessionClosed("the operands are paused")
            opened = self.inventory or await self._open_session()
            self._users += 1
        try:
            yield opened
        finally:
            async with self._idle:
                self._users -= 1
                self._idle.notify_all()

    async def opened(self, other_than: Inventory | None = None) -> Inventory:
        """Wait until a session is open, other than `other_than` (one seen before)."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: self.inventory is not None and self.inventory is not other_than
            )
            assert self.inventory is not None
            return self.inventory

    async def close(self) -> None:
        """Wait for the running rounds, then shut NVML down; the next round opens it again
        (after the session failed)."""
        async with self._transition:
            await self._close()

    async def pause(self) -> None:
        """Close the session and keep it closed until `resume()`."""
        async with self._transition:
            self.allowed = False
            await self._close()

    async def resume(self) -> None:
        """Let the next round open NVML again."""
        async with self._transition:
            self.allowed = True

    async def _close(self) -> None:
        async with self._idle:
            await self._idle.wait_for(lambda: self._users == 0)
        if self.inventory is None:
            return
        self.inventory, self.watcher = None, None
        try:
            await asyncio.to_thread(self.nvml.shutdown)
        except NvmlError as error:
            log.warning("NVML shutdown failed: %s", error)
        log.info("NVML closed")

    async def _open_session(self) -> Inventory:
        opened, self.watcher = await asyncio.to_thread(self._open)
        self.inventory = opened
        async with self._changed:
            self._changed.notify_all()
        log.info("NVML open: %d GPUs, driver %s", len(opened.gpus), opened.driver_version)
        return opened

    def _open(self) -> tuple[Inventory, EventWatcher | None]:
        nvml = self.nvml
        nvml.init()
        try:
            gpus = inventory(nvml)
            migs = tuple(mig for gpu in gpus for mig in _mig_devices(nvml, gpu))
            opened = Inventory(nvml.driver_version(), gpus, migs)
            try:
                watcher: EventWatcher | None = nvml.watch_events()
            except NotSupported as error:
                log.warning("no XID or ECC events on this node: %s", error)
                watcher = None
        except BaseException:
            with contextlib.suppress(NvmlError):
                nvml.shutdown()
            raise
        return opened, watcher


def _mig_devices(nvml: Nvml, gpu: DeviceInfo) -> tuple[MigDevice, ...]:
    if not gpu.mig_mode_current:
        return ()
    try:
        return nvml.mig_devices(gpu.index)
    except NvmlError as error:
        log.warning(
            "MIG devices of GPU %d unknown, their pods are not attributed: %s", gpu.index, error
        )
        return ()
