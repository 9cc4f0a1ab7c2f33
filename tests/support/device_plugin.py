"""Builders for the device plugin's unit tests: inventories of simulated GPUs, configs
written as an operator writes them, and RDMA devices laid out in a host root's sysfs."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuop.host.roots import HostRoot
from gpuop.nvml import opened
from gpuop.services.device_plugin.config import DevicePluginConfig
from gpuop.services.device_plugin.inventory import GpuInventory, read_inventory
from gpuop_sim.nvml.simulated import SimNvml

NODE = "gpu-1.example.com"


def sim_nvml(gpus: int = 8, mig: Mapping[int, Sequence[str]] | None = None) -> SimNvml:
    """A simulated node whose driver is always loaded, MIG enabled on the given GPUs."""
    nvml = SimNvml(gpus, node=NODE)
    for index, profiles in (mig or {}).items():
        nvml.enable_mig(index, profiles)
    return nvml


def sim_inventory(
    root: HostRoot, gpus: int = 8, mig: Mapping[int, Sequence[str]] | None = None
) -> GpuInventory:
    with opened(sim_nvml(gpus, mig)) as nvml:
        return read_inventory(nvml, root)


def config(document: dict[str, Any] | None = None) -> DevicePluginConfig:
    """A config from the document an operator would write (camelCase keys)."""
    return DevicePluginConfig.model_validate(document or {})


def strategies(*names: str) -> DevicePluginConfig:
    return config({"flags": {"plugin": {"deviceListStrategy": list(names)}}})


def add_hca(
    root: Path,
    name: str,
    *,
    address: str,
    vendor: str = "15b3",
    device: str = "1017",
    driver: str = "mlx5_core",
    link_layers: Sequence[str] = ("Ethernet",),
    interfaces: Sequence[str] = (),
    uverbs: int | None = None,
    umad: int | None = None,
) -> None:
    """Lay out one HCA as the kernel shows it in sysfs, with real symbolic links."""
    function = root / "sys/bus/pci/devices" / address
    function.mkdir(parents=True, exist_ok=True)
    (function / "vendor").write_text(f"0x{vendor}\n")
    (function / "device").write_text(f"0x{device}\n")
    (function / "class").write_text("0x020000\n")
    os.symlink(f"../../../../bus/pci/drivers/{driver}", function / "driver")
    for interface in interfaces:
        (function / "net" / interface).mkdir(parents=True)
    hca = root / "sys/class/infiniband" / name
    hca.mkdir(parents=True)
    os.symlink(f"../../../bus/pci/devices/{address}", hca / "device")
    for port, layer in enumerate(link_layers, start=1):
        (hca / "ports" / str(port)).mkdir(parents=True)
        (hca / "ports" / str(port) / "link_layer").write_text(f"{layer}\n")
    for kind, number in (("infiniband_verbs/uverbs", uverbs), ("infiniband_mad/umad", umad)):
        if number is not None:
            node = root / "sys/class" / f"{kind}{number}"
            node.mkdir(parents=True)
            (node / "ibdev").write_text(f"{name}\n")
