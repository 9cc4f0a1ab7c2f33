"""A node's GPUs as DRA devices, and the ResourceSlices of its pool, from its inventory.

Called by the device plugin's cluster role, which writes each DRA node's slices. Names,
attributes and capacities are those of NVIDIA's DRA driver for GPUs (driver
`gpu.nvidia.com`), so DeviceClasses and CEL selectors written for it select gpuop's devices
too: a whole GPU is `gpu-<minor>` of type `gpu`; a GPU in MIG mode publishes its MIG devices
as carved, `gpu-<minor>-mig-<profile without dots>-<GI profile id>-<placement start>` of type
`mig`, and not itself. Versions are semver as the driver's semver library normalises them
(`580.159.04` is `580.159.4`, CUDA `13.0` is `13.0.0`), brands and architectures are spelled
as NVIDIA's go-nvlib spells them (`Nvidia`, `Hopper`), memory is in bytes as a binary
quantity (`143771Mi`).

One pool per node, named after the node; its devices go into slices of at most
`MAX_DEVICES_PER_SLICE`, each carrying the pool's generation and slice count. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuop.events.dra import DRIVER
from gpuop.events.hardware import Gpu, HardwareDiscovered, MigInstance, MigMode

Obj = dict[str, Any]

MAX_DEVICES_PER_SLICE = 128
"""The API server's limit of devices in one ResourceSlice (without taints or counters)."""
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
"""The standard attribute of a device's PCI address (`0000:00:06.0`)."""
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
"""The standard attribute of a device's PCIe root complex (`pci0000:00`), for claims that
want devices below one root (`matchAttribute`); left out when the inventory does not know."""
API_VERSION = "resource.k8s.io/v1"
MAX_NAME = 253

BRANDS = {
    "Quadro": "Quadro",
    "Tesla": "Tesla",
    "NVS": "NVS",
    "GRID": "Grid",
    "GeForce": "GeForce",
    "Titan": "Titan",
    "NVIDIA Virtual Applications": "NvidiaVApps",
    "NVIDIA Virtual PC": "NvidiaVPC",
    "NVIDIA Virtual Compute Server": "NvidiaVCS",
    "NVIDIA RTX Virtual Workstation": "NvidiaVWS",
    "NVIDIA Cloud Gaming": "NvidiaCloudGaming",
    "Quadro RTX": "QuadroRTX",
    "NVIDIA RTX": "NvidiaRTX",
    "NVIDIA": "Nvidia",
    "GeForce RTX": "GeForceRTX",
    "Titan RTX": "TitanRTX",
}
"""nvidia-smi's brand spelling (the inventory's) to go-nvlib's (NVIDIA's DRA driver's)."""

_SEMVER_CORE = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?$")
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def semver(version: str | None) -> str | None:
    """A version as Masterminds' semver parses and prints it: missing parts are 0 and leading
    zeros go (`580.159.04` → `580.159.4`, `13.0` → `13.0.0`); None when it is no such version."""
    match = _SEMVER_CORE.match(version or "")
    if match is None:
        return None
    return ".".join(str(int(part or 0)) for part in match.groups())


def binary_quantity(count: int) -> str:
    """A count as Kubernetes writes a binary-SI quantity: the largest power of 1024 that
    divides it exactly (`150754820096` → `143771Mi`, `1500` → `1500`)."""
    exponent = 0
    while count >= 1024 and count % 1024 == 0 and exponent < len(_BINARY_SUFFIXES) - 1:
        count //= 1024
        exponent += 1
    return f"{count}{_BINARY_SUFFIXES[exponent]}"


def architecture_name(architecture: str | None) -> str | None:
    """GFD's family (`hopper`, `ada-lovelace`) as go-nvlib names it (`Hopper`, `Ada Lovelace`)."""
    if not architecture:
        return None
    return " ".join(word.capitalize() for word in architecture.split("-"))


def gpu_device_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor_number}"


def mig_device_name(gpu: Gpu, mig: MigInstance, position: int) -> str:
    """NVIDIA's name of a MIG device; without the GPU instance's profile id and placement
    (an inventory from before gpuop read them) its position among the GPU's MIG devices."""
    if mig.gpu_instance_profile_id is None or mig.placement_start is None:
        return f"gpu-{gpu.minor_number}-mig-{position}"
    profile = re.sub(r"[^a-z0-9]", "", mig.profile.lower())
    return (
        f"gpu-{gpu.minor_number}-mig-{profile}-{mig.gpu_instance_profile_id}-{mig.placement_start}"
    )


def _string(value: str) -> Obj:
    return {"string": value}


def _version(value: str | None) -> Obj | None:
    normalised = semver(value)
    return {"version": normalised} if normalised else None


def _common_attributes(gpu: Gpu, inventory: HardwareDiscovered) -> Obj:
    """What a GPU and its MIG devices both say of the GPU; absent values are left out."""
    brand = BRANDS.get(gpu.brand or "")
    candidates: dict[str, Obj | None] = {
        "productName": _string(gpu.model_name),
        "brand": _string(brand) if brand else None,
        "architecture": (_string(name) if (name := architecture_name(gpu.architecture)) else None),
        "cudaComputeCapability": _version(gpu.compute_capability),
        "driverVersion": _version(inventory.driver_version),
        "cudaDriverVersion": _version(inventory.cuda_driver_version),
        PCI_BUS_ID: _string(gpu.pci_bus_id),
        PCIE_ROOT: _string(gpu.pcie_root) if gpu.pcie_root else None,
    }
    return {key: value for key, value in candidates.items() if value is not None}


@dataclass(frozen=True)
class DraDevice:
    """One published device and the GPU (and MIG device) it is."""

    name: str
    gpu_uuid: str
    mig_uuid: str | None
    body: Obj
    """The device as a ResourceSlice lists it."""


def gpu_device(gpu: Gpu, inventory: HardwareDiscovered) -> DraDevice:
    attributes = {
        "type": _string("gpu"),
        "uuid": _string(gpu.uuid),
        **_common_attributes(gpu, inventory),
    }
    capacity = {"memory": {"value": binary_quantity(gpu.memory_bytes)}}
    name = gpu_device_name(gpu)
    body = {"name": name, "attributes": attributes, "capacity": capacity}
    return DraDevice(name, gpu.uuid, None, body)


def mig_device(
    gpu: Gpu, mig: MigInstance, position: int, inventory: HardwareDiscovered
) -> DraDevice:
    attributes = {
        "type": _string("mig"),
        "uuid": _string(mig.uuid),
        "parentUUID": _string(gpu.uuid),
        "profile": _string(mig.profile),
        **_common_attributes(gpu, inventory),
    }
    counts = {
        "memory": mig.memory_bytes,
        "multiprocessors": mig.multiprocessors,
        "copyEngines": mig.copy_engines,
        "decoders": mig.decoders,
        "encoders": mig.encoders,
        "jpegEngines": mig.jpeg_engines,
        "ofaEngines": mig.ofa_engines,
    }
    if mig.placement_start is not None and mig.placement_size is not None:
        for memory_slice in range(mig.placement_start, mig.placement_start + mig.placement_size):
            counts[f"memorySlice{memory_slice}"] = 1
    capacity = {key: {"value": binary_quantity(value)} for key, value in counts.items()}
    name = mig_device_name(gpu, mig, position)
    body = {"name": name, "attributes": attributes, "capacity": capacity}
    return DraDevice(name, gpu.uuid, mig.uuid, body)


def devices_of(inventory: HardwareDiscovered) -> tuple[DraDevice, ...]:
    """The node's devices by GPU minor number: each GPU, or, in MIG mode, its MIG devices."""
    devices: list[DraDevice] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.minor_number):
        if gpu.mig_mode is MigMode.ENABLED:
            devices += [
                mig_device(gpu, mig, position, inventory)
                for position, mig in enumerate(gpu.mig_devices)
            ]
        else:
            devices.append(gpu_device(gpu, inventory))
    return tuple(devices)


def slice_name(node: str, index: int) -> str:
    """The name of the pool's slice number `index`: the same for the same node every time,
    so a slice the kubelet wiped is made again under its name."""
    name = f"{node}-{DRIVER}-{index}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:16]
    return f"{name[: MAX_NAME - len(digest) - len(str(index)) - 2]}-{digest}-{index}"


def device_chunks(devices: tuple[DraDevice, ...]) -> list[list[Obj]]:
    """The devices split into slices of at most `MAX_DEVICES_PER_SLICE`; a node without GPUs
    publishes one empty slice, so its pool says it has none."""
    bodies = [device.body for device in devices]
    chunks = [
        bodies[start : start + MAX_DEVICES_PER_SLICE]
        for start in range(0, len(bodies), MAX_DEVICES_PER_SLICE)
    ]
    return chunks or [[]]


def resource_slices(
    node: str, node_uid: str, devices: tuple[DraDevice, ...], generation: int
) -> list[Obj]:
    """The ResourceSlices of `node`'s pool at `generation`, owned by its Node."""
    chunks = device_chunks(devices)
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {
                "name": slice_name(node, index),
                "labels": {"app.kubernetes.io/managed-by": "gpuop"},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
                ],
            },
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {
                    "name": node,
                    "generation": generation,
                    "resourceSliceCount": len(chunks),
                },
                "devices": chunk,
            },
        }
        for index, chunk in enumerate(chunks)
    ]


def same_content(published: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether a stored slice lists what `wanted` lists (devices, pool size, node), whatever
    the generations: a difference means the pool's generation must go up."""
    have = published.get("spec") or {}
    want = wanted.get("spec") or {}
    return (
        (have.get("devices") or []) == (want.get("devices") or [])
        and have.get("nodeName") == want.get("nodeName")
        and (have.get("pool") or {}).get("resourceSliceCount")
        == (want.get("pool") or {}).get("resourceSliceCount")
    )
