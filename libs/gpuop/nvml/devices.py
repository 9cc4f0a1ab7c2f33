"""What a GPU is: the inventory every backend reports through `Nvml.device_info()`.

Discovery turns `DeviceInfo` into the `hardware.discovered` inventory and the GPU Feature
Discovery labels; the device plugin takes UUIDs, minor numbers and NUMA nodes from it. These
values do not change while a driver stays loaded, so callers read them once per session.

Also here: NVML's numeric encodings that more than one backend decodes (architecture, brand,
compute mode, the CUDA driver version integer).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

MIB = 1024 * 1024
"""Bytes in a MiB; GFD's `nvidia.com/gpu.memory` label and DCGM's FB metrics count in MiB."""


class ComputeMode(enum.StrEnum):
    """Who may create CUDA contexts on the GPU (`nvmlComputeMode_t`)."""

    DEFAULT = "default"
    """Any number of processes."""
    EXCLUSIVE_THREAD = "exclusive-thread"
    """One context from one thread (support removed in recent drivers)."""
    PROHIBITED = "prohibited"
    """No contexts at all."""
    EXCLUSIVE_PROCESS = "exclusive-process"
    """One process at a time."""


COMPUTE_MODES: dict[int, ComputeMode] = {
    0: ComputeMode.DEFAULT,
    1: ComputeMode.EXCLUSIVE_THREAD,
    2: ComputeMode.PROHIBITED,
    3: ComputeMode.EXCLUSIVE_PROCESS,
}
"""`nvmlDeviceGetComputeMode` values."""

ARCHITECTURES: dict[int, str] = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada-lovelace",
    9: "hopper",
    10: "blackwell",
    13: "rubin",
}
"""`nvmlDeviceGetArchitecture` values, named the way GFD's `nvidia.com/gpu.family` names them."""

BRANDS: dict[int, str] = {
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "GRID",
    5: "GeForce",
    6: "Titan",
    7: "NVIDIA Virtual Applications",
    8: "NVIDIA Virtual PC",
    9: "NVIDIA Virtual Compute Server",
    10: "NVIDIA RTX Virtual Workstation",
    11: "NVIDIA Cloud Gaming",
    12: "Quadro RTX",
    13: "NVIDIA RTX",
    14: "NVIDIA",
    15: "GeForce RTX",
    16: "Titan RTX",
}
"""`nvmlDeviceGetBrand` values, spelled as `nvidia-smi -q` prints `product_brand`."""


def cuda_version(encoded: int) -> str:
    """NVML's CUDA driver version integer as `major.minor`: 13000 is `13.0`, 12080 `12.8`."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One physical GPU as NVML describes it. `None` means the GPU answers NotSupported."""

    index: int
    """NVML index on this node; may change across reboots, prefer `uuid`."""
    uuid: str
    """`GPU-20bce083-dbf9-2d4f-3c35-c858915accc5`: stable across reboots and reloads."""
    name: str
    """Product name: `NVIDIA H200`."""
    serial: str | None
    """Board serial number."""
    pci_bus_id: str
    """PCI address with NVML's 8-digit domain: `00000000:00:06.0`."""
    pci_device_id: int
    """NVML's combined id, device << 16 | vendor: `0x233510DE` for an H200."""
    pci_subsystem_id: int
    """Combined subsystem id, subsystem device << 16 | subsystem vendor: `0x18BF10DE`."""
    minor_number: int
    """Minor number of the device file `/dev/nvidia<minor>`."""
    memory_total_bytes: int
    """Total framebuffer memory."""
    compute_capability_major: int
    """CUDA compute capability, major part: 9 on Hopper."""
    compute_capability_minor: int
    """CUDA compute capability, minor part."""
    architecture: str | None
    """Family in GFD's spelling (`hopper`); `None` for an architecture NVML does not name."""
    brand: str | None
    """Brand as nvidia-smi prints it: `NVIDIA`."""
    mig_mode_current: bool | None
    """MIG on now; `None` when the GPU cannot do MIG."""
    mig_mode_pending: bool | None
    """MIG mode after the next GPU reset; `None` when the GPU cannot do MIG."""
    max_mig_devices: int | None
    """How many MIG devices the GPU can hold right now (0 while MIG is off)."""
    numa_node: int | None
    """NUMA node the GPU is attached to; `None` where the platform does not say (VMs)."""
    vbios_version: str | None
    """VBIOS version: `96.00.A5.00.1A`."""
    inforom_image_version: str | None
    """InfoROM image version: `G520.0282.02.02`."""
    board_part_number: str | None
    """Board part number: `692-2G520-0282-001`."""
    persistence_mode: bool | None
    """Whether the driver stays initialised with no clients."""
    compute_mode: ComputeMode | None
    """Who may create CUDA contexts."""
    ecc_enabled: bool | None
    """ECC on now; `None` when the memory has no ECC."""
    power_limit_mw: int | None
    """Power management limit in milliwatts."""
    max_sm_clock_mhz: int | None
    """Highest SM clock the GPU can run at."""
    fabric_clique: str | None = None
    """The multi-node NVLink domain the GPU's fabric manager put it in, as
    `<clusterUuid>.<cliqueId>` (what GPU Feature Discovery labels `nvidia.com/gpu.clique`);
    `None` where the GPU has no such fabric (an HGX H200: its NVLink stays in the chassis), or
    its registration has not completed."""

    @property
    def compute_capability(self) -> str:
        """`major.minor`, as the `hardware.discovered` inventory carries it: `9.0`."""
        return f"{self.compute_capability_major}.{self.compute_capability_minor}"

    @property
    def pci_vendor(self) -> int:
        """PCI vendor id: 0x10de."""
        return self.pci_device_id & 0xFFFF

    @property
    def pci_device(self) -> int:
        """PCI device id: 0x2335 for an H200."""
        return self.pci_device_id >> 16

    @property
    def sysfs_bus_id(self) -> str:
        """The PCI address as sysfs names it: 4-digit domain, lowercase, `0000:00:06.0`."""
        domain, _, rest = self.pci_bus_id.partition(":")
        return f"{int(domain, 16):04x}:{rest.lower()}"

    @property
    def memory_total_mib(self) -> int:
        """Total framebuffer memory in MiB, GFD's `nvidia.com/gpu.memory`: 143771 on an H200."""
        return self.memory_total_bytes // MIB
