"""Apply a MIG layout to a node's GPUs, read it back, and put the old one back on failure.

`apply` takes the layout wanted per GPU index (MIG on or off, and one profile per MIG device)
and works on the GPUs whose layout differs from it, leaving the others untouched:

    snapshot   each GPU's mode and GPU instances (profile, placement, compute instances)
    plan       every wanted profile known to the GPU, and a placement for each instance
               (`mig.fit`), before anything changes: a layout that cannot fit changes nothing.
               A real GPU names its profiles only while MIG is on (NVML answers NotSupported
               before), so a GPU turning MIG on is planned after the mode step; a layout
               that does not fit it then is put back like any failure
    clear      compute instances, then GPU instances, of the changing GPUs
    mode       MIG on or off where it differs; a change NVML leaves pending (it needs a GPU
               reset or a reboot) stops here with `ModePending`, nothing put back: the
               instances were to go anyway, and a reboot then the same apply finishes it
    create     each planned GPU instance at its placement, and its one compute instance
    verify     the layout read back equals the one asked for

A failure from `clear` on puts back the snapshot of every GPU touched: instances at their
recorded placements, so NVML gives them the same GPU instance ids (the simulated backend's
MIG devices then equal the old ones field for field; a real driver gives restored MIG devices
new UUIDs). `MigApplyFailed.restored` says whether that worked.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpuop.nvml.devices import DeviceInfo
from gpuop.nvml.errors import InUse, NotSupported, NvmlError
from gpuop.nvml.metrics import DeviceMetrics
from gpuop.nvml.mig import (
    GpuInstance,
    MigControl,
    MigDevice,
    MigModeState,
    MigProfile,
    Placement,
    fit,
)

log = logging.getLogger(__name__)


class MigBackend(MigControl, Protocol):
    """An NVML backend that reads and changes MIG (`PynvmlBackend`, `SimNvml`)."""

    def device_count(self) -> int: ...

    def device_info(self, index: int) -> DeviceInfo: ...

    def metrics(self, index: int) -> DeviceMetrics: ...

    def mig_profiles(self, index: int) -> tuple[MigProfile, ...]: ...

    def mig_devices(self, index: int) -> tuple[MigDevice, ...]: ...


@dataclass(frozen=True, slots=True)
class GpuLayout:
    """What one GPU looks like, as far as a MIG config says."""

    mig_enabled: bool
    profiles: tuple[str, ...] = ()
    """One profile per MIG device, sorted."""

    @classmethod
    def of(cls, mig_enabled: bool, profiles: Sequence[str]) -> GpuLayout:
        return cls(mig_enabled, tuple(sorted(profiles)))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One GPU's MIG state before a change: what a restore puts back."""

    index: int
    mode: MigModeState
    instances: tuple[GpuInstance, ...]


class MigApplyFailed(Exception):
    """The layout was not applied."""

    def __init__(self, message: str, *, restored: bool, changed: bool = True) -> None:
        super().__init__(message)
        self.message = message
        self.restored = restored
        """The GPUs have the layout of the snapshots again."""
        self.changed = changed
        """Something was changed before the failure (false: it failed while planning)."""


class InvalidLayout(MigApplyFailed):
    """A GPU cannot take its layout; nothing was changed (unless found only once MIG was on:
    then `changed`, and restored as any failure)."""

    def __init__(self, message: str, *, restored: bool = True, changed: bool = False) -> None:
        super().__init__(message, restored=restored, changed=changed)


class ModePending(MigApplyFailed):
    """A MIG mode change waits for a GPU reset or a reboot."""


class LayoutInUse(MigApplyFailed):
    """NVML refused because the GPU is in use."""


@dataclass(frozen=True, slots=True)
class Applied:
    """What an apply did."""

    changed: tuple[int, ...]
    """GPUs whose layout changed, by index."""
    mig_devices: int
    """MIG devices on the GPUs asked about afterwards."""


def current_layout(nvml: MigBackend, index: int) -> GpuLayout:
    """The GPU's layout now; MIG off when the GPU cannot do MIG."""
    try:
        mode = nvml.mig_mode(index)
    except NotSupported:
        return GpuLayout(False)
    return GpuLayout.of(mode.current, [d.profile for d in nvml.mig_devices(index)])


def snapshot(nvml: MigBackend, index: int) -> Snapshot:
    return Snapshot(index, nvml.mig_mode(index), nvml.gpu_instances(index))


def apply(nvml: MigBackend, wanted: Mapping[int, GpuLayout]) -> Applied:
    """Give each GPU its wanted layout; `MigApplyFailed` (restored where it could be)."""
    count = nvml.device_count()
    missing = sorted(i for i in wanted if not 0 <= i < count)
    if missing:
        raise InvalidLayout(f"no GPU at index {missing}: the node has {count}")
    changing = [i for i in sorted(wanted) if current_layout(nvml, i) != wanted[i]]
    plans = {i: _plan_now(nvml, i, wanted[i]) for i in changing}
    before = [snapshot(nvml, i) for i in changing]
    try:
        _carve(nvml, plans, wanted)
        _verify(nvml, {i: wanted[i] for i in changing})
    except ModePending:
        raise
    except (NvmlError, MigApplyFailed) as exc:
        restored = restore(nvml, before)
        message = f"{exc.message}; {'the layout before is back' if restored else 'restore failed'}"
        if isinstance(exc, InvalidLayout):
            raise InvalidLayout(message, restored=restored, changed=True) from exc
        failure = LayoutInUse if isinstance(exc, InUse) else MigApplyFailed
        raise failure(message, restored=restored) from exc
    devices = sum(len(nvml.mig_devices(i)) for i in wanted)
    return Applied(tuple(changing), devices)


def restore(nvml: MigBackend, snapshots: Sequence[Snapshot]) -> bool:
    """Put every GPU back as its snapshot says; whether each reads back so."""
    restored = True
    for before in snapshots:
        try:
            _clear(nvml, before.index)
            if nvml.mig_mode(before.index).pending != before.mode.pending:
                nvml.set_mig_mode(before.index, before.mode.pending)
            for instance in before.instances:
                _recreate(nvml, before.index, instance)
            restored = restored and snapshot(nvml, before.index) == before
        except NvmlError as exc:
            log.error("GPU %d: its MIG layout could not be put back: %s", before.index, exc)
            restored = False
    return restored


Plan = tuple[tuple[MigProfile, Placement], ...]
"""The GPU instances to create on one GPU, each at its placement."""


def _plan_now(nvml: MigBackend, index: int, layout: GpuLayout) -> Plan | None:
    """The plan, or None for a GPU turning MIG on that names no profile while it is off."""
    if layout.mig_enabled and not nvml.mig_profiles(index):
        try:
            if not nvml.mig_mode(index).current:
                return None
        except NotSupported:
            pass  # it cannot do MIG at all: `_plan` says so
    return _plan(nvml, index, layout)


def _plan(nvml: MigBackend, index: int, layout: GpuLayout) -> Plan:
    """The profiles to create on the GPU, with placements that fit; `InvalidLayout` else."""
    if not layout.mig_enabled:
        if layout.profiles:
            raise InvalidLayout(f"GPU {index}: MIG devices asked for with MIG disabled")
        return ()
    offered = {p.name: p for p in nvml.mig_profiles(index)}
    if not offered:
        raise InvalidLayout(f"GPU {index} cannot do MIG")
    unknown = sorted(set(layout.profiles) - offered.keys())
    if unknown:
        raise InvalidLayout(
            f"GPU {index} has no MIG profile {', '.join(unknown)} "
            f"(it offers: {', '.join(sorted(offered))})"
        )
    profiles = [offered[name] for name in layout.profiles]
    unplaced = sorted({p.name for p in profiles if not p.placements})
    if unplaced:
        raise InvalidLayout(f"GPU {index}: NVML names no placement for {', '.join(unplaced)}")
    placements = fit(profiles)
    if placements is None:
        raise InvalidLayout(f"GPU {index}: {', '.join(layout.profiles)} do not fit together")
    return tuple(zip(profiles, placements, strict=True))


def _carve(
    nvml: MigBackend, plans: Mapping[int, Plan | None], wanted: Mapping[int, GpuLayout]
) -> None:
    for index in plans:
        _clear(nvml, index)
    for index in plans:
        if nvml.mig_mode(index).pending != wanted[index].mig_enabled:
            nvml.set_mig_mode(index, wanted[index].mig_enabled)
    # also a change asked for by an earlier apply and still waiting for its reset
    pending = [index for index in plans if not nvml.mig_mode(index).settled]
    if pending:
        raise ModePending(
            f"the MIG mode change of GPU {pending} waits for a GPU reset or a reboot",
            restored=False,
        )
    for index, planned in plans.items():
        plan = _plan(nvml, index, wanted[index]) if planned is None else planned
        for profile, placement in plan:
            gi_id = nvml.create_gpu_instance(index, profile.profile_id, placement)
            nvml.create_compute_instance(index, gi_id)


def _verify(nvml: MigBackend, wanted: Mapping[int, GpuLayout]) -> None:
    for index, layout in wanted.items():
        found = current_layout(nvml, index)
        if found != layout:
            raise MigApplyFailed(
                f"GPU {index} reads back as {_describe(found)}, not {_describe(layout)}",
                restored=False,
            )


def _clear(nvml: MigBackend, index: int) -> None:
    """Destroy every compute instance, then every GPU instance, of the GPU."""
    instances = nvml.gpu_instances(index)
    for instance in instances:
        for ci_id in instance.compute_instance_ids:
            nvml.destroy_compute_instance(index, instance.gpu_instance_id, ci_id)
    for instance in instances:
        nvml.destroy_gpu_instance(index, instance.gpu_instance_id)


def _recreate(nvml: MigBackend, index: int, instance: GpuInstance) -> None:
    gi_id = nvml.create_gpu_instance(index, instance.profile_id, instance.placement)
    for _ in instance.compute_instance_ids:
        nvml.create_compute_instance(index, gi_id)


def _describe(layout: GpuLayout) -> str:
    if not layout.mig_enabled:
        return "MIG disabled"
    return f"MIG enabled with {', '.join(layout.profiles) or 'no devices'}"
