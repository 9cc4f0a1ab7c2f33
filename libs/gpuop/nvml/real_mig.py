"""MIG profiles and devices read through pynvml, for `PynvmlBackend`.

NVML names a GPU instance's profile only in its profile info (`MIG 1g.18gb`), and a MIG
device knows only the id of its GPU instance; so the profiles are read first, then each MIG
device is matched to its GPU instance's profile by id, the way NVIDIA's go-nvlib does it.

The write path below (`PynvmlBackend`'s `MigControl`) passes ctypes arrays and structures of
the loaded pynvml module (`c_nvmlGpuInstancePlacement_t`, `c_nvmlGpuInstance_t`) where
nvml.h takes pointers; a profile's placements are read with its info
(`read_profiles(..., placements=True)`) so a layout can be planned before anything changes.
"""

from __future__ import annotations

import ctypes
from typing import Any

from gpuop.nvml.binding import Binding, text
from gpuop.nvml.devices import MIB
from gpuop.nvml.errors import NotFound
from gpuop.nvml.mig import (
    GpuInstance,
    MigDevice,
    MigModeState,
    MigProfile,
    Placement,
    device_profile_name,
)

MIG_ENABLED = 1
"""`NVML_DEVICE_MIG_ENABLE`."""


def mig_enabled(nvml: Binding, handle: Any) -> bool:
    """MIG mode is on now."""
    mode = nvml.optional("nvmlDeviceGetMigMode", handle)
    return mode is not None and int(mode[0]) == MIG_ENABLED


def read_profiles(
    nvml: Binding, handle: Any, *, placements: bool = False
) -> tuple[MigProfile, ...]:
    """GPU instance profiles the GPU supports; empty when it cannot do MIG. With `placements`,
    each with where its instances may sit (one more call a profile)."""
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
                placements=read_placements(nvml, handle, int(info.id)) if placements else (),
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
        instance_info = nvml.call("nvmlGpuInstanceGetInfo", instance)
        profile_id = int(instance_info.profileId)
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
                placement=Placement(
                    int(instance_info.placement.start), int(instance_info.placement.size)
                ),
            )
        )
    return tuple(devices)


# The write path (`MigControl`), through pynvml's ctypes wrappers of nvml.h:
#   nvmlDeviceSetMigMode(device, mode, *activationStatus)
#   nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profileId, *placements, *count)
#   nvmlDeviceGetGpuInstances(device, profileId, *gpuInstances, *count)
#   nvmlDeviceCreateGpuInstanceWithPlacement(device, profileId, *placement, *gpuInstance)
#   nvmlGpuInstanceDestroy(gpuInstance)
#   nvmlGpuInstanceGetComputeInstanceProfileInfoV(gpuInstance, profile, engProfile, *info)
#   nvmlGpuInstanceCreateComputeInstance(gpuInstance, profileId, *computeInstance)
#   nvmlComputeInstanceDestroy(computeInstance)
# `profileId` is the profile info's `id` (19 for 1g.18gb); `profile` and `engProfile` are
# indexes (`NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE`, `..._ENGINE_PROFILE_SHARED`).

MAX_PLACEMENTS = 8
"""An instance sits on at least one of the eight memory slices, so no profile has more."""
MAX_INSTANCES = 8
COMPUTE_PROFILE_FOR_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
"""`NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE` of a compute instance spanning `n` slices."""


def mig_mode(nvml: Binding, handle: Any) -> MigModeState:
    current, pending = nvml.call("nvmlDeviceGetMigMode", handle)
    return MigModeState(current=int(current) == MIG_ENABLED, pending=int(pending) == MIG_ENABLED)


def set_mig_mode(nvml: Binding, handle: Any, enabled: bool) -> MigModeState:
    """Ask for the mode; NVML's activation status is read back as the pending mode."""
    mode = nvml.constant("NVML_DEVICE_MIG_ENABLE" if enabled else "NVML_DEVICE_MIG_DISABLE")
    nvml.call("nvmlDeviceSetMigMode", handle, mode)
    return mig_mode(nvml, handle)


def read_placements(nvml: Binding, handle: Any, profile_id: int) -> tuple[Placement, ...]:
    """Where instances of the profile may sit; empty when the driver does not say."""
    array = (nvml.lib.c_nvmlGpuInstancePlacement_t * MAX_PLACEMENTS)()
    count = ctypes.c_uint(MAX_PLACEMENTS)
    answer = nvml.probe(
        "nvmlDeviceGetGpuInstancePossiblePlacements", handle, profile_id, array, ctypes.byref(count)
    )
    if answer is None:
        return ()
    return tuple(Placement(int(p.start), int(p.size)) for p in array[: count.value])


def gpu_instances(
    nvml: Binding, handle: Any, profiles: tuple[MigProfile, ...], devices: tuple[MigDevice, ...]
) -> tuple[GpuInstance, ...]:
    """Every GPU instance, by id, with the compute instances its MIG devices name."""
    computes: dict[int, list[int]] = {}
    for device in devices:
        computes.setdefault(device.gpu_instance_id, []).append(device.compute_instance_id)
    found = []
    for profile in profiles:
        array = (nvml.lib.c_nvmlGpuInstance_t * MAX_INSTANCES)()
        count = ctypes.c_uint(MAX_INSTANCES)
        nvml.call(
            "nvmlDeviceGetGpuInstances", handle, profile.profile_id, array, ctypes.byref(count)
        )
        for instance in array[: count.value]:
            info = nvml.call("nvmlGpuInstanceGetInfo", instance)
            gi_id = int(info.id)
            found.append(
                GpuInstance(
                    gpu_instance_id=gi_id,
                    profile_id=int(info.profileId),
                    placement=Placement(int(info.placement.start), int(info.placement.size)),
                    compute_instance_ids=tuple(sorted(computes.get(gi_id, ()))),
                )
            )
    return tuple(sorted(found, key=lambda gi: gi.gpu_instance_id))


def create_gpu_instance(nvml: Binding, handle: Any, profile_id: int, placement: Placement) -> int:
    where = nvml.lib.c_nvmlGpuInstancePlacement_t(placement.start, placement.size)
    instance = nvml.call(
        "nvmlDeviceCreateGpuInstanceWithPlacement", handle, profile_id, ctypes.byref(where)
    )
    return int(nvml.call("nvmlGpuInstanceGetInfo", instance).id)


def destroy_gpu_instance(nvml: Binding, handle: Any, gpu_instance_id: int) -> None:
    instance = nvml.call("nvmlDeviceGetGpuInstanceById", handle, gpu_instance_id)
    nvml.call("nvmlGpuInstanceDestroy", instance)


def create_compute_instance(
    nvml: Binding, handle: Any, gpu_instance_id: int, profiles: tuple[MigProfile, ...]
) -> int:
    """One compute instance spanning the GPU instance, of the compute profile with its slices."""
    instance = nvml.call("nvmlDeviceGetGpuInstanceById", handle, gpu_instance_id)
    profile_id = int(nvml.call("nvmlGpuInstanceGetInfo", instance).profileId)
    slices = next((p.slice_count for p in profiles if p.profile_id == profile_id), None)
    if slices not in COMPUTE_PROFILE_FOR_SLICES:
        raise NotFound(f"GPU instance {gpu_instance_id}: no profile of id {profile_id}")
    info = nvml.call(
        "nvmlGpuInstanceGetComputeInstanceProfileInfo",
        instance,
        COMPUTE_PROFILE_FOR_SLICES[slices],
        nvml.constant("NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED"),
    )
    compute = nvml.call("nvmlGpuInstanceCreateComputeInstance", instance, int(info.id))
    return int(nvml.call("nvmlComputeInstanceGetInfo", compute).id)


def destroy_compute_instance(
    nvml: Binding, handle: Any, gpu_instance_id: int, compute_instance_id: int
) -> None:
    instance = nvml.call("nvmlDeviceGetGpuInstanceById", handle, gpu_instance_id)
    compute = nvml.call("nvmlGpuInstanceGetComputeInstanceById", instance, compute_instance_id)
    nvml.call("nvmlComputeInstanceDestroy", compute)
