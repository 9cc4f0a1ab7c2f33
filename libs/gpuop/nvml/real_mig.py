"""MIG profiles and devices read through pynvml, for `PynvmlBackend`.

NVML names a GPU instance's profile only in its profile info (`MIG 1g.18gb`), and a MIG
device knows only the id of its GPU instance; so the profiles are read first, then each MIG
device is matched to its GPU instance's profile by id, the way NVIDIA's go-nvlib does it.
"""

from __future__ import annotations

from typing import Any

from gpuop.nvml.binding import Binding, text
from gpuop.nvml.devices import MIB
from gpuop.nvml.errors import NotFound
from gpuop.nvml.mig import MigDevice, MigProfile, device_profile_name

MIG_ENABLED = 1
"""`NVML_DEVICE_MIG_ENABLE`."""


def mig_enabled(nvml: Binding, handle: Any) -> bool:
    """MIG mode is on now."""
    mode = nvml.optional("nvmlDeviceGetMigMode", handle)
    return mode is not None and int(mode[0]) == MIG_ENABLED


def read_profiles(nvml: Binding, handle: Any) -> tuple[MigProfile, ...]:
    """GPU instance profiles the GPU supports; empty when it cannot do MIG."""
    if nvml.optional("nvmlDeviceGetMigMode", handle) is None:
        return ()
    profiles = []
    for profile in range(nvml.constant("NVML_GPU_INSTANCE_PROFILE_COUNT")):
        info = nvml.probe("nvmlDeviceGetGpuInstanceProfileInfo", handle, profile)
        if info is None or int(info.instanceCount) == 0:
            continue
        profiles.append(
            MigProfile(
                name=text(info.name).removeprefix("MIG "),
                profile_id=int(info.id),
                slice_count=int(info.sliceCount),
                instance_count=int(info.instanceCount),
                memory_bytes=int(info.memorySizeMB) * MIB,
                multiprocessor_count=int(info.multiprocessorCount),
                copy_engines=int(info.copyEngineCount),
                decoders=int(info.decoderCount),
                encoders=int(info.encoderCount),
                jpeg_engines=int(info.jpegCount),
                ofa_engines=int(info.ofaCount),
            )
        )
    return tuple(profiles)


def read_devices(
    nvml: Binding, handle: Any, parent_index: int, parent_uuid: str
) -> tuple[MigDevice, ...]:
    """The MIG devices of one GPU; empty unless MIG mode is on."""
    if not mig_enabled(nvml, handle):
        return ()
    names = {profile.profile_id: profile.name for profile in read_profiles(nvml, handle)}
    devices = []
    for slot in range(int(nvml.call("nvmlDeviceGetMaxMigDeviceCount", handle))):
        try:
            mig = nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
        except NotFound:
            continue  # an empty slot: instances need not be numbered densely
        gi_id = int(nvml.call("nvmlDeviceGetGpuInstanceId", mig))
        ci_id = int(nvml.call("nvmlDeviceGetComputeInstanceId", mig))
        attrs = nvml.call("nvmlDeviceGetAttributes", mig)
        instance = nvml.call("nvmlDeviceGetGpuInstanceById", handle, gi_id)
        profile_id = int(nvml.call("nvmlGpuInstanceGetInfo", instance).profileId)
        gi_slices = int(attrs.gpuInstanceSliceCount)
        ci_slices = int(attrs.computeInstanceSliceCount)
        memory_mb = int(attrs.memorySizeMB)
        gi_profile = names.get(profile_id) or f"{gi_slices}g.{round(memory_mb / 1024)}gb"
        devices.append(
            MigDevice(
                parent_index=parent_index,
                parent_uuid=parent_uuid,
                index=slot,
                uuid=text(nvml.call("nvmlDeviceGetUUID", mig)),
                profile=device_profile_name(gi_profile, gi_slices, ci_slices),
                gpu_instance_id=gi_id,
                compute_instance_id=ci_id,
                gpu_instance_profile_id=profile_id,
                gpu_instance_slices=gi_slices,
                compute_instance_slices=ci_slices,
                memory_total_bytes=memory_mb * MIB,
                multiprocessor_count=int(attrs.multiprocessorCount),
                copy_engines=int(attrs.sharedCopyEngineCount),
                decoders=int(attrs.sharedDecoderCount),
                encoders=int(attrs.sharedEncoderCount),
                jpeg_engines=int(attrs.sharedJpegCount),
                ofa_engines=int(attrs.sharedOfaCount),
            )
        )
    return tuple(devices)
