"""A discovered node for the discovery tests: its inventory (H200s), its Node object, and
its labels as the API server has them."""

from __future__ import annotations

from typing import Any

from gpuop.events.hardware import Gpu, HardwareDiscovered, MigMode, PciFunction
from gpuop.inventory import scanning
from gpuop.kube import client, nodes

NODE = "gpu-1.example.com"
GPU_FUNCTION = PciFunction(
    address="0000:00:06.0",
    vendor_id="10de",
    device_id="2335",
    class_id="030200",
    subsystem_vendor_id="10de",
    subsystem_device_id="18bf",
    driver="nvidia",
)


def h200(index: int) -> Gpu:
    return Gpu(
        uuid=f"GPU-20bce083-dbf9-2d4f-3c35-c858915acc{index:02d}",
        index=index,
        minor_number=index,
        pci_bus_id="0000:00:06.0",
        model_name="NVIDIA H200",
        memory_bytes=150754820096,
        mig_mode=MigMode.DISABLED,
        compute_capability="9.0",
        architecture="hopper",
    )


def inventory(gpus: int = 1, **overrides: Any) -> HardwareDiscovered:
    values: dict[str, Any] = {
        "gpus": tuple(h200(i) for i in range(gpus)),
        "pci_functions": (GPU_FUNCTION,),
        "kernel_release": "6.18.44-fc-v657-gpu",
        "machine": "x86_64",
        "os_id": "ubuntu",
        "os_version_id": "24.04",
        "boot_id": "6f0e6b1c-3a52-4b8e-9a1d-0c5c2f3e4d5a",
        "driver_version": "580.159.04" if gpus else None,
        "cuda_driver_version": "13.0" if gpus else None,
        "inventory_hash": scanning.PLACEHOLDER_HASH,
    }
    values.update(overrides)
    return scanning.hashed(HardwareDiscovered.model_validate(values))


def node_object(labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "labels": labels or {}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


async def labels_on(kube: client.Kube) -> dict[str, str]:
    return nodes.labels_of(await nodes.get(kube, NODE))
