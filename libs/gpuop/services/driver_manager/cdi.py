"""The node's CDI spec, `<host root>/var/run/cdi/nvidia.com-gpu.json`: rewritten as the last
step of every GPU driver load and restored by every rollback, so the names
`nvidia.com/gpu=0`, `=GPU-<uuid>` and `=all` always give a container the user space of the
module that runs (`gpuop.host.cdi` says what the spec holds).

Called by `executor.Executor` once `LoadDriver` loaded the modules (their user space switched
with them) and once `RollbackDriver` loaded the version rolled back to:

    load        the spec for the version in use and the GPUs NVML sees, written atomically;
                the spec it replaces is kept as `<file>.previous`
    rollback    that previous spec put back byte for byte when it is the rolled-back
                version's; otherwise (none kept, or another version's) made as after a load
    format 1    no user space in use (stand-in or old packages): the spec is removed, since
                its mounts would be another version's libraries beside this module, and
                kept as the previous spec. So is it when NVML sees no GPU (the validation fails
                the driver for that, naming the count it expected)

NVML that cannot start yet is asked again every `poll_seconds` until the step's deadline, as
the validation asks it. A spec that cannot be made (NVML never answers, the manifest is
broken, the disk is full) fails the step: the load or rollback answers its failure, with the
reason in the message, and the saga rolls back or stops, as for a module that will not load.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from gpuop.clocks import Clock
from gpuop.events.driver import Component
from gpuop.host import cdi
from gpuop.host.roots import HostRoot
from gpuop.inventory import cdi_devices
from gpuop.nvml import NvmlError
from gpuop.services.driver_manager import installing
from gpuop.services.driver_manager.validating import NvmlFactory

log = logging.getLogger(__name__)


class SpecFailed(Exception):
    """The CDI spec could not be written; the message says why."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


class SpecWriter:
    """Keeps one host root's `nvidia.com/gpu` spec in step with the loaded driver."""

    def __init__(
        self, root: HostRoot, nvml: NvmlFactory, clock: Clock, poll_seconds: float = 1.0
    ) -> None:
        self.root = root
        self.nvml = nvml
        self.clock = clock
        self.poll_seconds = poll_seconds

    @property
    def path(self) -> Path:
        return cdi.spec_path(self.root)

    async def after_load(self, component: Component, version: str, timeout: float) -> None:
        """Write the spec for `version`, just loaded; `SpecFailed` when it cannot be made
        within `timeout` seconds."""
        if component is not Component.GPU:
            return
        if installing.active_userspace(self.root, str(component)) is None:
            if self.path.exists():
                log.info("GPU driver %s has no user space: removing %s", version, self.path)
                cdi.retire(self.path)
            return
        try:
            data = await self._generate(timeout)
        except cdi.NoDevices:
            log.warning("driver %s sees no GPU: no CDI spec at %s", version, self.path)
            cdi.retire(self.path)
            return
        try:
            changed = await asyncio.to_thread(cdi.write, self.path, data)
        except OSError as exc:
            raise SpecFailed(
                f"cannot write the CDI spec {self.path}: {exc}", retryable=True
            ) from None
        log.info(
            "CDI spec for driver %s %s at %s",
            version,
            "written" if changed else "unchanged",
            self.path,
        )

    async def after_rollback(self, component: Component, version: str, timeout: float) -> None:
        """Put back the spec kept from before the rejected version when it is `version`'s,
        else write it afresh (`after_load`)."""
        if component is Component.GPU and await asyncio.to_thread(
            cdi.restore_previous, self.path, version
        ):
            log.info("CDI spec of driver %s restored at %s", version, self.path)
            return
        await self.after_load(component, version, timeout)

    async def _generate(self, timeout: float) -> bytes:
        deadline = self.clock.monotonic() + timeout
        while True:
            try:
                return await asyncio.to_thread(cdi_devices.generate, self.root, self.nvml())
            except cdi.NoDevices:
                raise
            except cdi.CdiError as exc:
                raise SpecFailed(f"no CDI spec: {exc}", retryable=False) from None
            except NvmlError as exc:
                if self.clock.monotonic() >= deadline:
                    raise SpecFailed(
                        f"no CDI spec: NVML did not name the GPUs within {timeout} s: {exc}",
                        retryable=True,
                    ) from None
            await self.clock.sleep(self.poll_seconds)
