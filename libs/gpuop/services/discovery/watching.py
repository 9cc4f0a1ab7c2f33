"""Wakes discovery's scan as soon as a CDI spec or a container runtime's configuration
changes, so the `nvidia.com/cdi.ready` and `gpuop.io/runtime.nvidia` labels follow the
driver-manager's spec and drop-in within a second instead of a scan period.

Run by `node_agent.NodeAgent` beside its scan loop. One inotify watch
(`gpuop.host.inotify`, written-and-closed files included) per directory in `DIRECTORIES`
that exists; a change sets the agent's wake-up event after `settle_seconds`, so a burst of
writes is one scan. A directory that does not exist yet (`/var/run/cdi` before the first
spec, `/etc/crio` on a containerd node) or that went away is looked for again every
`recheck_seconds`, and its appearance wakes a scan too (a spec may have been written with
it, before the watch was set). Where no watch can be set at all, the scan period remains.
"""

from __future__ import annotations

import asyncio
import logging

from gpuop.host import cdi_specs, inotify, runtime_handlers
from gpuop.host.roots import HostRoot

log = logging.getLogger(__name__)

DIRECTORIES = (*cdi_specs.SPEC_DIRECTORIES, *runtime_handlers.CONFIG_DIRECTORIES)
"""Where the specs and the runtimes' configuration and drop-ins live, under the host root."""


class ConfigWatch:
    """Sets `wake` when anything in `DIRECTORIES` changes; see the module docstring."""

    def __init__(
        self,
        root: HostRoot,
        directories: tuple[str, ...] = DIRECTORIES,
        *,
        recheck_seconds: float = 5.0,
        settle_seconds: float = 0.2,
    ) -> None:
        self._root = root
        self._directories = directories
        self._recheck = recheck_seconds
        self._settle = settle_seconds
        self._watches: dict[str, inotify.DirectoryWatch] = {}
        self._unavailable: dict[str, str] = {}
        """Directory -> why it is not watched, as last logged."""

    @property
    def watched(self) -> tuple[str, ...]:
        """The directories watched now."""
        return tuple(sorted(self._watches))

    async def run(self, wake: asyncio.Event, stopping: asyncio.Event) -> None:
        """Watch until `stopping` is set; every watch is closed on the way out."""
        try:
            self._arm()
            while not stopping.is_set():
                changed = await self._changed_within(self._recheck, stopping)
                if self._arm():
                    changed = True
                if changed and not stopping.is_set():
                    await asyncio.sleep(self._settle)
                    for watch in self._watches.values():
                        watch.changed.clear()
                    wake.set()
        finally:
            for watch in self._watches.values():
                watch.close()
            self._watches.clear()

    def _arm(self) -> bool:
        """Drop the watches the kernel ended, set those that can be set now; whether a
        directory was newly watched."""
        for directory, watch in list(self._watches.items()):
            if watch.gone:
                watch.close()
                del self._watches[directory]
        armed = False
        for directory in self._directories:
            if directory in self._watches:
                continue
            try:
                path = self._root.resolve(directory)
                self._watches[directory] = inotify.DirectoryWatch(path, inotify.CONTENT)
            except (inotify.WatchUnavailable, OSError) as error:
                reason = str(error)
                if self._unavailable.get(directory) != reason:
                    log.debug("not watching %s: %s", directory, reason)
                    self._unavailable[directory] = reason
                continue
            self._unavailable.pop(directory, None)
            log.debug("watching %s for CDI specs and runtime configuration", directory)
            armed = True
        return armed

    async def _changed_within(self, seconds: float, stopping: asyncio.Event) -> bool:
        """Wait until a watched directory changes, `stopping` is set or `seconds` pass."""
        waiters = [asyncio.create_task(watch.changed.wait()) for watch in self._watches.values()]
        waiters.append(asyncio.create_task(stopping.wait()))
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
        return any(watch.changed.is_set() for watch in self._watches.values())
