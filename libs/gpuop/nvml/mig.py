"""Multi-Instance GPU: the profiles a GPU offers and the MIG devices carved out of it.

The device plugin advertises MIG devices under the `single` and `mixed` strategies
(`nvidia.com/mig-<profile>`), and discovery derives the MIG attribute labels
(`nvidia.com/mig-1g.18gb.multiprocessors`, `.slices.gi`, `.engines.copy`, ...) from them.
Both come from `Nvml.mig_profiles()` and `Nvml.mig_devices()`; a GPU with MIG off, or one
that cannot do MIG, has no MIG devices.

Profile names follow NVIDIA's: `<gpu slices>g.<memory GB>gb`, with a compute-instance prefix
`<compute slices>c.` when a compute instance uses only part of its GPU instance
(`1c.2g.35gb`) and suffixes such as `+me` for media extensions.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MigProfile:
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
    multiprocessor_count: int
    """Streaming multiprocessors of one instance."""
    copy_engines: int
    """Copy engines of one instance."""
    decoders: int
    """Video decoders (NVDEC)."""
    encoders: int
    """Video encoders (NVENC)."""
    jpeg_engines: int
    """JPEG decoders (NVJPG)."""
    ofa_engines: int
    """Optical flow accelerators."""


@dataclass(frozen=True, slots=True)
class MigDevice:
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
    multiprocessor_count: int
    """Streaming multiprocessors."""
    copy_engines: int
    """Copy engines."""
    decoders: int
    """Video decoders."""
    encoders: int
    """Video encoders."""
    jpeg_engines: int
    """JPEG decoders."""
    ofa_engines: int
    """Optical flow accelerators."""


def device_profile_name(gpu_instance_profile: str, gi_slices: int, ci_slices: int) -> str:
    """The MIG device's profile: the GPU instance's, prefixed `<ci>c.` for a partial CI."""
    if ci_slices == gi_slices:
        return gpu_instance_profile
    return f"{ci_slices}c.{gpu_instance_profile}"
