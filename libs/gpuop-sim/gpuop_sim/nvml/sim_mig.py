"""MIG on a simulated H200: its profiles, and laying out MIG devices for `SimNvml.enable_mig`.

An H200 splits into 7 compute slices and 8 memory slices. The profiles, their NVML ids and
engine counts follow NVIDIA's MIG user guide for Hopper (H100 and H200 share the layout; the
H200's memory names them `1g.18gb` ... `7g.141gb`); memory per instance is one eighth of the
recorded framebuffer per memory slice, rounded down to 256 MiB. A layout is accepted when
its instances fit the slices and no profile exceeds its instance count; real placement rules
are stricter, which the simulation does not need.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from gpuop.nvml.devices import MIB
from gpuop.nvml.mig import MigDevice, MigProfile

COMPUTE_SLICES = 7
MEMORY_SLICES = 8


@dataclass(frozen=True, slots=True)
class _Shape:
    name: str
    profile_id: int
    slices: int
    memory_slices: int
    instances: int
    multiprocessors: int
    copy: int
    decoders: int
    jpeg: int
    ofa: int


_H200 = (
    _Shape("1g.18gb", 19, 1, 1, 7, 16, 1, 1, 1, 0),
    _Shape("1g.18gb+me", 20, 1, 1, 1, 16, 1, 1, 1, 1),
    _Shape("1g.35gb", 15, 1, 2, 4, 16, 1, 1, 1, 0),
    _Shape("2g.35gb", 14, 2, 2, 3, 32, 2, 2, 2, 0),
    _Shape("3g.71gb", 9, 3, 4, 2, 60, 3, 3, 3, 0),
    _Shape("4g.71gb", 5, 4, 4, 1, 64, 4, 4, 4, 0),
    _Shape("7g.141gb", 0, 7, 8, 1, 132, 8, 7, 7, 1),
)
H200_PROFILE_NAMES = tuple(shape.name for shape in _H200)
"""Every GPU instance profile a simulated H200 offers."""


def h200_profiles(memory_total_bytes: int) -> tuple[MigProfile, ...]:
    """The H200's GPU instance profiles for a GPU with this much framebuffer."""
    slice_bytes = _slice_bytes(memory_total_bytes)
    return tuple(
        MigProfile(
            name=shape.name,
            profile_id=shape.profile_id,
            slice_count=shape.slices,
            instance_count=shape.instances,
            memory_bytes=shape.memory_slices * slice_bytes,
            multiprocessor_count=shape.multiprocessors,
            copy_engines=shape.copy,
            decoders=shape.decoders,
            encoders=0,
            jpeg_engines=shape.jpeg,
            ofa_engines=shape.ofa,
        )
        for shape in _H200
    )


def layout(
    parent_index: int, parent_uuid: str, memory_total_bytes: int, profiles: Sequence[str]
) -> tuple[MigDevice, ...]:
    """MIG devices for the profiles, in order, one full compute instance each.

    Raises `ValueError` when a profile is unknown or the layout does not fit the GPU.
    """
    shapes = {shape.name: shape for shape in _H200}
    unknown = sorted(set(profiles) - shapes.keys())
    if unknown:
        raise ValueError(f"not an H200 MIG profile: {', '.join(unknown)}")
    chosen = [shapes[name] for name in profiles]
    for name, count in Counter(profiles).items():
        if count > shapes[name].instances:
            raise ValueError(f"at most {shapes[name].instances} instances of {name} fit a GPU")
    if sum(s.slices for s in chosen) > COMPUTE_SLICES:
        raise ValueError(f"{', '.join(profiles)} need more than {COMPUTE_SLICES} compute slices")
    if sum(s.memory_slices for s in chosen) > MEMORY_SLICES:
        raise ValueError(f"{', '.join(profiles)} need more than {MEMORY_SLICES} memory slices")
    slice_bytes = _slice_bytes(memory_total_bytes)
    devices = []
    for position, shape in enumerate(chosen):
        # NVML numbers the whole-GPU instance 0 and smaller ones from 1.
        gpu_instance_id = 0 if shape.slices == COMPUTE_SLICES else position + 1
        devices.append(
            MigDevice(
                parent_index=parent_index,
                parent_uuid=parent_uuid,
                index=position,
                uuid=mig_uuid(parent_uuid, gpu_instance_id, 0),
                profile=shape.name,
                gpu_instance_id=gpu_instance_id,
                compute_instance_id=0,
                gpu_instance_profile_id=shape.profile_id,
                gpu_instance_slices=shape.slices,
                compute_instance_slices=shape.slices,
                memory_total_bytes=shape.memory_slices * slice_bytes,
                multiprocessor_count=shape.multiprocessors,
                copy_engines=shape.copy,
                decoders=shape.decoders,
                encoders=0,
                jpeg_engines=shape.jpeg,
                ofa_engines=shape.ofa,
            )
        )
    return tuple(devices)


def mig_uuid(parent_uuid: str, gpu_instance_id: int, compute_instance_id: int) -> str:
    """A MIG device UUID in the driver's format, `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`,
    stable for a parent GPU and instance ids."""
    digest = hashlib.sha256(
        f"{parent_uuid}/{gpu_instance_id}/{compute_instance_id}".encode()
    ).hexdigest()
    return f"MIG-{_uuid_body(digest)}"


def _uuid_body(digest: str) -> str:
    return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _slice_bytes(memory_total_bytes: int) -> int:
    return (memory_total_bytes // MEMORY_SLICES) // (256 * MIB) * (256 * MIB)
