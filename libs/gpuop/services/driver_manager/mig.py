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
`reboot-required`, label `rebooting`, as upstream's mig-manager does) and sends the layout
again under a new command id once the node is back with a new boot id.

The MIG mode survives a driver reload and a reboot, the GPU and compute instances do not
(upstream's mig-manager applies its config again after every boot). So each apply that ends
applied records the node's layout on the host, `<host root>/var/lib/gpuop/mig-layout.json`
(`LAYOUT_FILE`: the config and, per GPU, MIG on or off and each instance's profile and
placement), and `reapply` puts it back after the driver came up again: the executor calls it
after a `LoadDriver`, a rollback's load and a reboot (from `ValidateDriver`) and the resetter
after a GPU reset, before answering, each writing the CDI spec after it. A restarted
driver-manager reads the same file. `reapply` changes only the GPUs whose layout differs
from the record, at the recorded placements (so the simulated GPUs' MIG devices keep their
UUIDs), and raises `ReapplyFailed` when it cannot: the step then fails with that message.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Literal, cast

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuop.events import mig_commands
from gpuop.events.driver import Component
from gpuop.host.files import write_atomic
from gpuop.host.roots import HostRoot
from gpuop.nvml import NotSupported, NvmlError, opened
from gpuop.nvml.mig import GpuInstance, MigControl, MigModeState, Placement
from gpuop.nvml.mig_layout import (
    GpuLayout,
    InvalidLayout,
    LayoutInUse,
    MigApplyFailed,
    MigBackend,
    ModePending,
    Snapshot,
    current_layout,
    restore,
)
from gpuop.nvml.mig_layout import apply as apply_layout
from gpuop.services.driver_manager import holders
from gpuop.services.driver_manager.cdi import SpecFailed, SpecWriter
from gpuop.services.driver_manager.resetting import PERSISTENCE_DAEMON
from gpuop.services.driver_manager.validating import NvmlFactory

log = logging.getLogger(__name__)

Reason = mig_commands.MigFailureReason
LAYOUT_FILE = "var/lib/gpuop/mig-layout.json"
LAYOUT_FORMAT: Final = "gpuop-mig-layout/1"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class RecordedInstance(_Frozen):
    """One GPU instance as an apply left it."""

    gpu_instance_id: int
    profile: str
    profile_id: int
    start: int
    size: int
    compute_instance_ids: tuple[int, ...]


class RecordedGpu(_Frozen):
    """One GPU's MIG mode and instances as an apply left them."""

    index: int
    mig_enabled: bool
    instances: tuple[RecordedInstance, ...] = ()

    def layout(self) -> GpuLayout:
        return GpuLayout.of(self.mig_enabled, [i.profile for i in self.instances])

    def snapshot(self) -> Snapshot:
        """What `mig_layout.restore` puts back."""
        instances = tuple(
            GpuInstance(
                gpu_instance_id=i.gpu_instance_id,
                profile_id=i.profile_id,
                placement=Placement(i.start, i.size),
                compute_instance_ids=i.compute_instance_ids,
            )
            for i in self.instances
        )
        return Snapshot(self.index, MigModeState(self.mig_enabled, self.mig_enabled), instances)


class AppliedLayout(_Frozen):
    """The whole `LAYOUT_FILE`: the node's layout after the last apply."""

    format: Literal["gpuop-mig-layout/1"] = LAYOUT_FORMAT
    config: str
    """The mig-parted config applied last (`nvidia.com/mig.config`)."""
    gpus: tuple[RecordedGpu, ...]


class ReapplyFailed(Exception):
    """The recorded layout could not be put back; the message says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Refused(Exception):
    """The command cannot be carried out; nothing was changed."""

    def __init__(self, reason: mig_commands.MigFailureReason, message: str) -> None:
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
        self, command_id: str, command: mig_commands.ApplyMigLayout
    ) -> mig_commands.MigLayoutApplied | mig_commands.MigLayoutFailed:
        def failed(reason: Reason, message: str, restored: bool) -> mig_commands.MigLayoutFailed:
            return mig_commands.MigLayoutFailed(
                command_id=command_id,
                config=command.config,
                reason=reason,
                restored=restored,
                message=message[:2048],
            )

        try:
            wanted = wanted_layouts(command)
            changed, devices = await asyncio.to_thread(self._apply, command.config, wanted)
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
        return mig_commands.MigLayoutApplied(
            command_id=command_id,
            config=command.config,
            changed_gpus=changed,
            mig_devices=devices,
        )

    def _apply(self, config: str, wanted: Mapping[int, GpuLayout]) -> tuple[tuple[int, ...], int]:
        try:
            with opened(self.nvml()) as nvml:
                if not isinstance(nvml, MigControl):
                    raise Refused(Reason.NOT_SUPPORTED, "this NVML backend cannot change MIG")
                backend = cast(MigBackend, nvml)  # an Nvml that changes MIG is one
                _refuse_busy(backend, wanted, self._file_holders())
                applied = apply_layout(backend, wanted)
                self._record(config, backend)
                return applied.changed, applied.mig_devices
        except NotSupported as exc:
            raise Refused(Reason.NOT_SUPPORTED, f"NVML: {exc}") from exc
        except NvmlError as exc:
            raise Refused(Reason.APPLY_FAILED, f"NVML: {exc}") from exc

    async def reapply(self, timeout: float, *, spec: bool = False) -> tuple[int, ...]:
        """Put the recorded layout back where the GPUs lost it (a driver reload, a reboot, a
        reset); the GPUs changed. With `spec`, the CDI spec is written again after a change.
        `ReapplyFailed` when it cannot be put back."""
        recorded = self.recorded()
        if recorded is None:
            return ()
        changed = await asyncio.to_thread(self._reapply, recorded)
        if changed:
            log.warning("MIG config %s applied again on GPUs %s", recorded.config, changed)
        if changed and spec:
            version = self.driver_version() or "in use"
            try:
                await self.specs.after_load(Component.GPU, version, timeout)
            except SpecFailed as exc:
                raise ReapplyFailed(
                    f"MIG config {recorded.config} applied again, but the CDI spec could not "
                    f"be written: {exc.message}"
                ) from None
        return changed

    def recorded(self) -> AppliedLayout | None:
        """The layout the last apply left; None when none was recorded (or no host root).
        `ReapplyFailed` when the file is not one."""
        if self.root is None:
            return None
        path = self.root.join(LAYOUT_FILE)
        try:
            return AppliedLayout.model_validate_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValidationError) as exc:
            raise ReapplyFailed(f"the recorded MIG layout {path} is unreadable: {exc}") from None

    def _reapply(self, recorded: AppliedLayout) -> tuple[int, ...]:
        what = f"the MIG config {recorded.config} applied before"
        try:
            with opened(self.nvml()) as nvml:
                if not isinstance(nvml, MigControl):
                    raise ReapplyFailed(f"{what}: this NVML backend cannot change MIG")
                backend = cast(MigBackend, nvml)
                return _put_back(backend, recorded.gpus, what)
        except NvmlError as exc:
            raise ReapplyFailed(f"{what} could not be put back: NVML: {exc}") from exc

    def _record(self, config: str, backend: MigBackend) -> None:
        """Write the node's layout now as the one to put back after a reload."""
        if self.root is None:
            return
        gpus = tuple(_recorded_gpu(backend, i) for i in range(backend.device_count()))
        layout = AppliedLayout(config=config, gpus=gpus)
        try:
            write_atomic(self.root.join(LAYOUT_FILE), layout.model_dump_json(indent=1) + "\n")
        except OSError as exc:
            log.error(
                "MIG config %s applied but not recorded (%s): a driver reload or a "
                "reboot will not bring it back",
                config,
                exc,
            )

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

    async def _spec_after(self, what: str, command: mig_commands.ApplyMigLayout) -> str:
        """Write the CDI spec again; '' when written, else why not (for the message)."""
        version = self.driver_version() or "in use"
        try:
            await self.specs.after_load(Component.GPU, version, command.timeout_seconds)
        except SpecFailed as exc:
            log.error("no CDI spec for %s: %s", what, exc.message)
            return f"; the CDI spec for {what} could not be written: {exc.message}"
        return ""


def _recorded_gpu(backend: MigBackend, index: int) -> RecordedGpu:
    layout = current_layout(backend, index)
    if not layout.mig_enabled:
        return RecordedGpu(index=index, mig_enabled=False)
    names = {p.profile_id: p.name for p in backend.mig_profiles(index)}
    instances = tuple(
        RecordedInstance(
            gpu_instance_id=i.gpu_instance_id,
            profile=names.get(i.profile_id, str(i.profile_id)),
            profile_id=i.profile_id,
            start=i.placement.start,
            size=i.placement.size,
            compute_instance_ids=i.compute_instance_ids,
        )
        for i in backend.gpu_instances(index)
    )
    return RecordedGpu(index=index, mig_enabled=True, instances=instances)


def _put_back(backend: MigBackend, gpus: Sequence[RecordedGpu], what: str) -> tuple[int, ...]:
    """Restore each recorded GPU whose layout differs; the GPUs restored."""
    count = backend.device_count()
    missing = [gpu.index for gpu in gpus if gpu.index >= count]
    if missing:
        raise ReapplyFailed(f"{what} names GPUs {missing}, and NVML sees {count}")
    stale = [gpu for gpu in gpus if current_layout(backend, gpu.index) != gpu.layout()]
    restore(backend, [gpu.snapshot() for gpu in stale])
    wrong = [gpu for gpu in stale if current_layout(backend, gpu.index) != gpu.layout()]
    if wrong:
        found = "; ".join(
            f"GPU {gpu.index} has {_describe(current_layout(backend, gpu.index))}, not "
            f"{_describe(gpu.layout())}"
            for gpu in wrong
        )
        raise ReapplyFailed(f"{what} could not be put back: {found}")
    return tuple(gpu.index for gpu in stale)


def _describe(layout: GpuLayout) -> str:
    if not layout.mig_enabled:
        return "MIG disabled"
    return f"MIG enabled with {', '.join(layout.profiles) or 'no devices'}"


def wanted_layouts(command: mig_commands.ApplyMigLayout) -> dict[int, GpuLayout]:
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


def _reason(exc: MigApplyFailed) -> mig_commands.MigFailureReason:
    if isinstance(exc, InvalidLayout):
        return Reason.INVALID_LAYOUT
    if isinstance(exc, ModePending):
        return Reason.MODE_PENDING
    if isinstance(exc, LayoutInUse):
        return Reason.IN_USE
    return Reason.APPLY_FAILED
