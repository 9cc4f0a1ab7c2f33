"""The MIG step on this node: `ApplyMigLayout` in, `MigLayoutApplied` or `MigLayoutFailed` out.

`executor.Executor` calls `MigApplier.apply` for the command, which the MIG saga sends once
the operands holding the node's GPUs are paused and the pods on the GPUs being re-carved
evicted. In one NVML session (from the configured backend; it must change MIG, as the real
and simulated ones do, not the recorded one):

    in use     a GPU whose layout changes still runs processes: refused (`in-use`), nothing
               changed; NVML would refuse the mode change anyway, and destroying instances
               under a process kills it. A process counts when NVML lists it computing on
               the GPU or it holds the GPU's `/dev/nvidia<minor>` (`holders.gpu_holders`,
               the agent itself and the persistence daemon aside)
    apply      `gpuop.nvml.mig_layout.apply`: only the GPUs whose layout differs, read back;
               on failure the layout read at the start is put back (`restored`)
    CDI        after an apply that changed a GPU, and after a restore, the node's CDI spec is
               written again (`cdi.SpecWriter`), so `nvidia.com/gpu=<gpu>:<mig>` and the
               MIG UUIDs name the devices there are now

NVML's MIG calls block for up to seconds on a real GPU and run in a thread. A mode change
NVML leaves pending answers `mode-pending`, not restored: the saga reboots the node (state
`rebooting`, as upstream's mig-manager does) and sends the same command again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from typing import cast

from gpuop.events import mig
from gpuop.events.driver import Component
from gpuop.host.roots import HostRoot
from gpuop.nvml import NotSupported, NvmlError, opened
from gpuop.nvml.mig import MigControl
from gpuop.nvml.mig_layout import (
    GpuLayout,
    InvalidLayout,
    LayoutInUse,
    MigApplyFailed,
    MigBackend,
    ModePending,
    current_layout,
)
from gpuop.nvml.mig_layout import apply as apply_layout
from gpuop.services.driver_manager import holders
from gpuop.services.driver_manager.cdi import SpecFailed, SpecWriter
from gpuop.services.driver_manager.resetting import PERSISTENCE_DAEMON
from gpuop.services.driver_manager.validating import NvmlFactory

log = logging.getLogger(__name__)

Reason = mig.MigFailureReason


class Refused(Exception):
    """The command cannot be carried out; nothing was changed."""

    def __init__(self, reason: mig.MigFailureReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class MigApplier:
    """Applies MIG layouts to this node's GPUs and keeps the CDI spec in step."""

    def __init__(
        self,
        nvml: NvmlFactory,
        specs: SpecWriter,
        driver_version: Callable[[], str | None],
        root: HostRoot | None = None,
        own_pid: int | None = None,
    ) -> None:
        self.nvml = nvml
        self.specs = specs
        self.driver_version = driver_version
        self.root = root
        """Where to look for device file holders; None: NVML's processes only."""
        self.own_pid = os.getpid() if own_pid is None else own_pid

    async def apply(
        self, command_id: str, command: mig.ApplyMigLayout
    ) -> mig.MigLayoutApplied | mig.MigLayoutFailed:
        def failed(reason: Reason, message: str, restored: bool) -> mig.MigLayoutFailed:
            return mig.MigLayoutFailed(
                command_id=command_id,
                config=command.config,
                reason=reason,
                restored=restored,
                message=message[:2048],
            )

        try:
            wanted = wanted_layouts(command)
            changed, devices = await asyncio.to_thread(self._apply, wanted)
        except Refused as refused:
            return failed(refused.reason, refused.message, True)
        except MigApplyFailed as exc:
            message = exc.message
            if exc.changed and exc.restored:
                message += await self._spec_after("the restored layout", command)
            return failed(_reason(exc), message, exc.restored)
        if changed:
            problem = await self._spec_after("the new layout", command)
            if problem:
                return failed(Reason.CDI_FAILED, f"layout applied{problem}", False)
        log.info("MIG config %s applied: GPUs changed %s", command.config, changed or "none")
        return mig.MigLayoutApplied(
            command_id=command_id,
            config=command.config,
            changed_gpus=changed,
            mig_devices=devices,
        )

    def _apply(self, wanted: Mapping[int, GpuLayout]) -> tuple[tuple[int, ...], int]:
        try:
            with opened(self.nvml()) as nvml:
                if not isinstance(nvml, MigControl):
                    raise Refused(Reason.NOT_SUPPORTED, "this NVML backend cannot change MIG")
                backend = cast(MigBackend, nvml)  # an Nvml that changes MIG is one
                _refuse_busy(backend, wanted, self._file_holders())
                applied = apply_layout(backend, wanted)
                return applied.changed, applied.mig_devices
        except NotSupported as exc:
            raise Refused(Reason.NOT_SUPPORTED, f"NVML: {exc}") from exc
        except NvmlError as exc:
            raise Refused(Reason.APPLY_FAILED, f"NVML: {exc}") from exc

    def _file_holders(self) -> dict[int, list[str]]:
        """`name[pid]` of the processes holding each GPU's device file, by minor."""
        if self.root is None:
            return {}
        by_minor: dict[int, list[str]] = {}
        for holder in holders.gpu_holders(self.root, excluding=self.own_pid):
            if holder.name.startswith(PERSISTENCE_DAEMON):
                continue
            for minor in holder.minors:
                by_minor.setdefault(minor, []).append(f"{holder.name}[{holder.pid}]")
        return by_minor

    async def _spec_after(self, what: str, command: mig.ApplyMigLayout) -> str:
        """Write the CDI spec again; '' when written, else why not (for the message)."""
        version = self.driver_version() or "in use"
        try:
            await self.specs.after_load(Component.GPU, version, command.timeout_seconds)
        except SpecFailed as exc:
            log.error("no CDI spec for %s: %s", what, exc.message)
            return f"; the CDI spec for {what} could not be written: {exc.message}"
        return ""


def wanted_layouts(command: mig.ApplyMigLayout) -> dict[int, GpuLayout]:
    """The command's layouts by GPU index; `Refused` for a GPU listed twice."""
    wanted: dict[int, GpuLayout] = {}
    for layout in command.layouts:
        if layout.gpu_index in wanted:
            message = f"GPU {layout.gpu_index} is given two layouts"
            raise Refused(Reason.INVALID_LAYOUT, message)
        profiles = [d.profile for d in layout.devices for _ in range(d.count)]
        wanted[layout.gpu_index] = GpuLayout.of(layout.mig_enabled, profiles)
    return wanted


def _refuse_busy(
    backend: MigBackend, wanted: Mapping[int, GpuLayout], file_holders: Mapping[int, list[str]]
) -> None:
    """`Refused(in-use)` when a GPU whose layout changes runs processes."""
    count = backend.device_count()
    busy = []
    for index, layout in sorted(wanted.items()):
        if not 0 <= index < count or current_layout(backend, index) == layout:
            continue
        users = [f"pid {p.pid}" for p in backend.metrics(index).processes]
        users += file_holders.get(backend.device_info(index).minor_number, [])
        if users:
            busy.append(f"GPU {index} ({', '.join(users)})")
    if busy:
        raise Refused(Reason.IN_USE, f"processes hold GPUs to re-carve: {'; '.join(busy)}")


def _reason(exc: MigApplyFailed) -> mig.MigFailureReason:
    if isinstance(exc, InvalidLayout):
        return Reason.INVALID_LAYOUT
    if isinstance(exc, ModePending):
        return Reason.MODE_PENDING
    if isinstance(exc, LayoutInUse):
        return Reason.IN_USE
    return Reason.APPLY_FAILED
