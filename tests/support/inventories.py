"""Inventories for labeling tests: one recorded H200 and its PCI functions, as discovery
reports them, and a simulated node's after MIG devices were carved."""

from __future__ import annotations

from pathlib import Path

from gpuop.events.hardware import Gpu, HardwareDiscovered, MigMode, PciFunction
from gpuop.host.roots import HostRoot
from gpuop.inventory import scanning
from gpuop.nvml import Nvml, open_backend, opened
from gpuop.nvml.mig_layout import GpuLayout, apply
from gpuop_sim.cluster import hosts

H200 = Gpu(
    uuid="GPU-20bce083-dbf9-2d4f-3c35-c858915accc5",
    index=0,
    minor_number=0,
    pci_bus_id="00000000:00:06.0",
    model_name="NVIDIA H200",
    memory_bytes=150754820096,
    mig_mode=MigMode.DISABLED,
    compute_capability="9.0",
    architecture="hopper",
)
GPU_FUNCTION = PciFunction(
    address="0000:00:06.0",
    vendor_id="10de",
    device_id="2335",
    class_id="030200",
    subsystem_vendor_id="10de",
    subsystem_device_id="18be",
    driver="nvidia",
)
NIC_FUNCTION = PciFunction(
    address="0000:00:05.0",
    vendor_id="15b3",
    device_id="101d",
    class_id="020000",
    subsystem_vendor_id="15b3",
    subsystem_device_id="0001",
)


def inventory(gpus: tuple[Gpu, ...] = (H200,), **overrides: object) -> HardwareDiscovered:
    values: dict[str, object] = {
        "gpus": gpus,
        "pci_functions": (GPU_FUNCTION, NIC_FUNCTION),
        "kernel_release": "6.18.44-fc-v657-gpu",
        "machine": "x86_64",
        "os_id": "ubuntu",
        "os_version_id": "24.04",
        "boot_id": "6f0e6b1c-3a52-4b8e-9a1d-0c5c2f3e4d5a",
        "driver_version": "580.159.04",
        "cuda_driver_version": "13.0",
        "inventory_hash": "0" * 64,
    }
    values.update(overrides)
    return HardwareDiscovered.model_validate(values)


def carved(
    tmp_path: Path,
    layouts: dict[int, GpuLayout],
    gpus: int = 2,
    boot_id: str = "6f0e6b1c-3a52-4b8e-9a1d-0c5c2f3e4d5a",
) -> HardwareDiscovered:
    """The inventory of a simulated node after `layouts` were applied by another session."""
    root = hosts.build_host_root(tmp_path / "host", "node-1", gpus, boot_id=boot_id)

    def backend() -> Nvml:
        return open_backend(f"sim:{gpus}", host_root=root.path, node="node-1")

    with opened(backend()) as writer:
        apply(writer, layouts)  # type: ignore[arg-type]
    return scanning.scan(HostRoot(root.path), backend())


def one_gpu(
    device_id: str, *, kernel: str, machine: str = "x86_64", driver: str | None = None
) -> HardwareDiscovered:
    """What discovery reports for a node whose one NVIDIA GPU (PCI `device_id`) no driver
    has brought up yet: no NVML answers, its architecture only in the device id."""
    function = PciFunction(
        address="0000:1b:00.0",
        vendor_id="10de",
        device_id=device_id,
        class_id="030200",
        subsystem_vendor_id="10de",
        subsystem_device_id="0000",
    )
    return HardwareDiscovered(
        pci_functions=(function,),
        kernel_release=kernel,
        machine=machine,
        boot_id="8c1f2f5e-0c53-4d57-a0a4-3e3c1b0c9a11",
        driver_version=driver,
        inventory_hash="0" * 64,
    )
