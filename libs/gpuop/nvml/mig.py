"""Multi-Instance GPU: the profiles a GPU offers and the MIG devices carved out of it.

The device plugin advertises MIG devices under the `single` and `mixed` strategies
(`nvidia.com/mig-<profile>`), and discovery derives the MIG attribute labels
(`nvidia.com/mig-1g.18gb.multiprocessors`, `.slices.gi`, `.engines.copy`, ...) from them.
Both come from `Nvml.mig_profiles()` and `Nvml.mig_devices()`; a GPU with MIG off, or one
that cannot do MIG, has no MIG devices.

Profile names follow NVIDIA's: `<gpu slices>g.<memory GB>gb`, with a compute-instance prefix
`<compute slices>c.` when a compute instance uses only part of its GPU instance
(`1c.2g.35gb`) and suffixes such as `+me` for media extensions.

Changing MIG is `MigControl`, which the real backend (`real_mig`) and the simulated one
implement and the driver-manager uses (`mig_layout`): MIG mode on or off, GPU instances
created at a placement or destroyed, one compute instance per GPU instance. A placement is
where an instance sits among the GPU's eight memory slices; NVML names the slots each
profile may start at, and an instance that overlaps another fails with
`InsufficientResources`, as NVML does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class MigEngines:
    """The share of the GPU's engines one MIG instance has: what each instance of a
    `MigProfile` gets, and what a `MigDevice` has."""

    multiprocessor_count: int
    """Streaming multiprocessors."""
    copy_engines: int
    """Copy engines."""
    decoders: int
    """Video decoders (NVDEC)."""
    encoders: int
    """Video encoders (NVENC)."""
    jpeg_engines: int
    """JPEG decoders (NVJPG)."""
    ofa_engines: int
    """Optical flow accelerators."""


@dataclass(frozen=True, slots=True)
class MigProfile(MigEngines):
    """A GPU instance profile the GPU supports (`nvmlGpuInstanceProfileInfo_v2_t`)."""

    name: str
    """Profile name without NVML's `MIG ` prefix: `1g.18gb`."""
    profile_id: int
    """NVML's profile id, as `nvidia-smi mig -lgip` lists it: 19 for `1g.18gb` on Hopper."""
    slice_count: int
    """GPU (compute) slices the profile takes, of 7."""
    instance_count: int
    """How many instances of this profile fit on an empty GPU."""
    memory_bytes: int
    """Framebuffer of one instance."""
    placements: tuple[Placement, ...] = ()
    """Where an instance of the profile may sit (`nvmlDeviceGetGpuInstancePossiblePlacements`);
    empty when the backend did not say."""


@dataclass(frozen=True, slots=True, order=True)
class Placement:
    """A GPU instance's memory slices (`nvmlGpuInstancePlacement_t`)."""

    start: int
    """First memory slice."""
    size: int
    """Memory slices."""

    def overlaps(self, other: Placement) -> bool:
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(frozen=True, slots=True)
class GpuInstance:
    """One GPU instance on a GPU (`nvmlGpuInstanceInfo_t`) and its compute instances."""

    gpu_instance_id: int
    profile_id: int
    """`MigProfile.profile_id`."""
    placement: Placement
    compute_instance_ids: tuple[int, ...]
    """Its compute instances, by id."""


@dataclass(frozen=True, slots=True)
class MigModeState:
    """`nvmlDeviceGetMigMode`: the mode in force, and the one after the next GPU reset."""

    current: bool
    pending: bool

    @property
    def settled(self) -> bool:
        """No change waits for a reset."""
        return self.current == self.pending


@runtime_checkable
class MigControl(Protocol):
    """What changes MIG on a GPU, by NVML index. Needs root on a real node; every call
    raises an `NvmlError` as NVML answers (`InUse` while processes hold the GPU,
    `InsufficientResources` for an instance that does not fit)."""

    def mig_mode(self, index: int) -> MigModeState:
        """The GPU's MIG mode; `NotSupported` when it cannot do MIG."""
        ...

    def set_mig_mode(self, index: int, enabled: bool) -> MigModeState:
        """Ask for MIG on or off; the answer says whether it took effect or waits for a
        reset (`pending` differs from `current`)."""
        ...

    def gpu_instances(self, index: int) -> tuple[GpuInstance, ...]:
        """The GPU instances on the GPU, by id; empty when MIG is off."""
        ...

    def create_gpu_instance(self, index: int, profile_id: int, placement: Placement) -> int:
        """Create a GPU instance of the profile at the placement; its id."""
        ...

    def destroy_gpu_instance(self, index: int, gpu_instance_id: int) -> None:
        """Destroy a GPU instance that has no compute instance left."""
        ...

    def create_compute_instance(self, index: int, gpu_instance_id: int) -> int:
        """Create one compute instance spanning the whole GPU instance; its id."""
        ...

    def destroy_compute_instance(
        self, index: int, gpu_instance_id: int, compute_instance_id: int
    ) -> None:
        """Destroy a compute instance."""
        ...


def fit(
    wanted: Sequence[MigProfile], taken: Sequence[Placement] = ()
) -> tuple[Placement, ...] | None:
    """A placement for each profile, in order, none overlapping another or `taken`; None when
    the profiles cannot all sit on the GPU. Larger instances are placed first, and every
    placement a profile offers is tried, so a layout that fits any way is found."""
    order = sorted(range(len(wanted)), key=lambda i: (-wanted[i].slice_count, i))
    chosen: dict[int, Placement] = {}

    def place(position: int, used: list[Placement]) -> bool:
        if position == len(order):
            return True
        i = order[position]
        for candidate in wanted[i].placements:
            if any(candidate.overlaps(other) for other in used):
                continue
            chosen[i] = candidate
            if place(position + 1, [*used, candidate]):
                return True
        return False

    if not place(0, list(taken)):
        return None
    return tuple(chosen[i] for i in range(len(wanted)))


@dataclass(frozen=True, slots=True)
class MigDevice(MigEngines):
    """One MIG device: a compute instance inside a GPU instance, usable as a GPU."""

    parent_index: int
    """NVML index of the physical GPU."""
    parent_uuid: str
    """UUID of the physical GPU."""
    index: int
    """Position among the parent's MIG devices (`nvmlDeviceGetMigDeviceHandleByIndex`)."""
    uuid: str
    """`MIG-2e4b5e4c-...`: what CUDA_VISIBLE_DEVICES and the device plugin name it by."""
    profile: str
    """Profile name: `1g.18gb`, or `1c.2g.35gb` for a partial compute instance."""
    gpu_instance_id: int
    """GPU instance id on the parent (`GPU_I_ID` in dcgm-exporter labels)."""
    compute_instance_id: int
    """Compute instance id inside the GPU instance."""
    gpu_instance_profile_id: int
    """`MigProfile.profile_id` of the GPU instance."""
    gpu_instance_slices: int
    """GPU slices of the GPU instance (`nvidia.com/mig-<p>.slices.gi`)."""
    compute_instance_slices: int
    """GPU slices of the compute instance (`nvidia.com/mig-<p>.slices.ci`)."""
    memory_total_bytes: int
    """Framebuffer of the device."""
    placement: Placement | None = None
    """The GPU instance's memory slices; None where the backend does not say."""


def device_profile_name(gpu_instance_profile: str, gi_slices: int, ci_slices: int) -> str:
    """The MIG device's profile: the GPU instance's, prefixed `<ci>c.` for a partial CI."""
    if ci_slices == gi_slices:
        return gpu_instance_profile
    return f"{ci_slices}c.{gpu_instance_profile}"
