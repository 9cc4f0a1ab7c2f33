"""What a node is made of: its GPU and PCI inventory, kernel, OS, driver and boot, and
whether containers can be given its GPUs (container runtimes with the `nvidia` handler, CDI
specs).

Published by the discovery service's node role, which reads the host root and NVML:
`HardwareDiscovered` whenever anything in the inventory changed (including the boot id, so a
reboot always produces one), and `HardwareHeartbeat` on a fixed period so the cluster side can
notice a missed inventory (its hash differs from the stored one) or a silent reboot.

Consumed by discovery's cluster role (node labels, the `gpuop_nodes` KV bucket), by the
upgrade orchestrator (which driver runs where; a new boot id confirms a reboot) and by the
device plugin and telemetry for the device list. `RescanHardware` asks discovery for a fresh
inventory at once, for example after a driver load.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, ClassVar

from pydantic import Field, StringConstraints

from gpuop.events.driver import Flavour
from gpuop.events.envelope import Command, Event
from gpuop.events.fields import (
    BootId,
    Bytes,
    Count,
    DocumentedEnum,
    GpuUuid,
    Message,
    ModuleName,
    Record,
    Seconds,
    Sha256,
    Version,
)

PciAddress = Annotated[
    str,
    StringConstraints(pattern=r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$"),
]
"""A PCI function address as sysfs writes it: `0000:00:06.0` (NVML's 8-digit domain allowed)."""
HexId16 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{4}$")]
"""A 16-bit PCI id as 4 lowercase hex digits without `0x`: `10de`."""
HexClass = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{6}$")]
"""A PCI class code as 6 lowercase hex digits without `0x`: `030200` (3D controller)."""
NumaNode = Annotated[int, Field(ge=0, le=1023)]
"""A NUMA node number."""
ShortText = Annotated[str, StringConstraints(min_length=1, max_length=128)]
"""A short free-form name reported by the hardware or the OS."""


class MigMode(DocumentedEnum):
    """Multi-Instance GPU mode of one GPU."""

    DISABLED = "disabled"
    """MIG is supported but off: the whole GPU is one device."""
    ENABLED = "enabled"
    """MIG is on: the GPU is split into MIG devices."""
    UNSUPPORTED = "unsupported"
    """The GPU cannot do MIG."""


class MigInstance(Record):
    """One MIG device of a GPU (a compute instance in its GPU instance), with what GPU Feature
    Discovery's per-profile labels (`nvidia.com/mig-<profile>.*`) say of it."""

    uuid: Annotated[str, StringConstraints(pattern=r"^MIG-[0-9a-fA-F-]{36}$")]
    """`MIG-2e4b5e4c-...`: what the device plugin and CDI name it by."""
    profile: Annotated[
        str,
        StringConstraints(
            pattern=r"^([0-9]{1,2}c\.)?[0-9]{1,2}g\.[0-9]{1,4}gb([+-][a-z.]{1,16})?$"
        ),
    ]
    """Its profile: `1g.18gb`, `1c.2g.35gb`."""
    gpu_instance_slices: Annotated[int, Field(ge=1, le=8)]
    """GPU slices of its GPU instance (`.slices.gi`)."""
    compute_instance_slices: Annotated[int, Field(ge=1, le=8)]
    """GPU slices of its compute instance (`.slices.ci`)."""
    memory_bytes: Bytes
    """Its framebuffer (`.memory`, in MiB)."""
    multiprocessors: Count
    """Streaming multiprocessors."""
    copy_engines: Count = 0
    """Copy engines."""
    decoders: Count = 0
    """Video decoders."""
    encoders: Count = 0
    """Video encoders."""
    jpeg_engines: Count = 0
    """JPEG decoders."""
    ofa_engines: Count = 0
    """Optical flow accelerators."""
    gpu_instance_profile_id: Annotated[int, Field(ge=0, le=63)] | None = None
    """NVML's profile id of its GPU instance; absent in inventories from before gpuop read it."""
    placement_start: Annotated[int, Field(ge=0, le=7)] | None = None
    """First memory slice of its GPU instance; absent where NVML did not say."""
    placement_size: Annotated[int, Field(ge=1, le=8)] | None = None
    """Memory slices of its GPU instance; absent where NVML did not say."""


class Gpu(Record):
    """One physical GPU as NVML reports it."""

    uuid: GpuUuid
    """Stable identity of the GPU across reboots and driver reloads."""
    index: Annotated[int, Field(ge=0, le=63)]
    """NVML index on this node (may change across reboots; prefer `uuid`)."""
    minor_number: Annotated[int, Field(ge=0, le=255)]
    """Minor number of its device file, `/dev/nvidia<minor>`."""
    pci_bus_id: PciAddress
    """PCI address of the GPU."""
    model_name: ShortText
    """Product name: `NVIDIA H200`."""
    memory_bytes: Bytes
    """Total framebuffer memory."""
    numa_node: NumaNode | None = None
    """NUMA node the GPU is attached to; absent when the platform does not say."""
    pcie_root: (
        Annotated[str, StringConstraints(pattern=r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")] | None
    ) = None
    """The PCIe root complex it sits below, as sysfs names it (`pci0000:00`); absent when the
    host root does not say."""
    mig_mode: MigMode
    """Current MIG mode."""
    compute_capability: Annotated[str, StringConstraints(pattern=r"^[0-9]{1,2}\.[0-9]{1,2}$")]
    """CUDA compute capability, `major.minor`: `9.0`."""
    architecture: Annotated[str, StringConstraints(pattern=r"^[a-z0-9-]{1,32}$")] | None = None
    """GPU architecture family in lowercase (`hopper`), when NVML names it."""
    brand: ShortText | None = None
    """Brand as nvidia-smi prints it (`NVIDIA`), when NVML names it."""
    clique: Annotated[str, StringConstraints(pattern=r"^[0-9a-f-]{36}\.[0-9]{1,10}$")] | None = None
    """Its multi-node NVLink domain, `<clusterUuid>.<cliqueId>`; absent when it has none."""
    mig_devices: tuple[MigInstance, ...] = Field(default=(), max_length=7)
    """Its MIG devices, by position; empty when MIG is off (and in inventories from before
    gpuop read them)."""


class PciFunction(Record):
    """One PCI function of the node, from sysfs."""

    address: PciAddress
    """PCI address: `0000:00:06.0`."""
    vendor_id: HexId16
    """Vendor id: `10de` is NVIDIA, `15b3` is Mellanox."""
    device_id: HexId16
    """Device id: `2335` is an H200."""
    class_id: HexClass
    """Class code: `030200` is a 3D controller, `020000` an Ethernet controller."""
    subsystem_vendor_id: HexId16
    """Subsystem vendor id."""
    subsystem_device_id: HexId16
    """Subsystem device id."""
    numa_node: NumaNode | None = None
    """NUMA node; absent when sysfs says `-1`."""
    link_speed_gts: Annotated[float, Field(ge=0, le=1024)] | None = None
    """Current PCIe link speed in GT/s per lane (`32.0` for Gen5); absent when unknown."""
    link_width: Annotated[int, Field(ge=0, le=64)] | None = None
    """Current PCIe link width in lanes; absent when unknown."""
    driver: ModuleName | None = None
    """Kernel driver bound to the function (`nvidia`, `mlx5_core`); absent when unbound."""


class ContainerRuntimeName(DocumentedEnum):
    """A container runtime gpuop can configure for NVIDIA."""

    CONTAINERD = "containerd"
    """containerd (1.6, 1.7 or 2.x)."""
    CRIO = "crio"
    """CRI-O."""


class ContainerRuntime(Record):
    """One container runtime installed on the node, as its configuration stands on disk."""

    name: ContainerRuntimeName
    """Which runtime."""
    version: Version | None = None
    """Its version from the package database or its binary (`1.6.20~ds1-1+deb12u3`,
    `v2.0.0`); absent when neither says."""
    nvidia_handler: bool = False
    """Whether its configuration, as it would load it at its next start (main file, imports
    or drop-ins), defines the runtime handler `nvidia` that the RuntimeClass `nvidia` names."""
    config_error: Message | None = None
    """Why it would refuse its configuration (a file that does not parse, naming it);
    absent when the configuration reads."""
    cdi_enabled: bool | None = None
    """Whether it gives a container the devices a CDI name asks for: containerd 1.6 never,
    1.7 with `enable_cdi = true`, 2.x unless `enable_cdi = false`, CRI-O from 1.24 always;
    absent when neither its version nor its configuration says."""


class CdiSpec(Record):
    """One CDI spec file of kind `nvidia.com/gpu` (or of unknown kind, when malformed) in
    `/etc/cdi` or `/var/run/cdi`."""

    path: Annotated[str, StringConstraints(pattern=r"^/[^\x00]{1,1023}$")]
    """Where the host has it: `/var/run/cdi/nvidia.com-gpu.json`."""
    cdi_version: Version | None = None
    """Its `cdiVersion` (`0.5.0`); absent when the file is malformed before it says."""
    device_count: Count = 0
    """Devices it defines (by index, by UUID and `all` each count); 0 when malformed."""
    error: Message | None = None
    """Why a container runtime would refuse it; absent for a valid spec."""


ADDED_FIELDS = ("container_runtimes", "cdi_specs")
"""`HardwareDiscovered` fields added after its first release; see `content_hash`."""
ADDED_GPU_FIELDS = ("mig_devices",)
"""`Gpu` fields added after its first release, left out of the hash the same way."""


class HardwareDiscovered(Event):
    """The full inventory of one node, published whenever any part of it changed."""

    DOMAIN: ClassVar[str] = "hardware"
    NAME: ClassVar[str] = "discovered"

    gpus: tuple[Gpu, ...] = Field(default=(), max_length=64)
    """Every NVIDIA GPU NVML sees, by index; empty when no driver is loaded."""
    pci_functions: tuple[PciFunction, ...] = Field(default=(), max_length=1024)
    """Every PCI function of the node, by address."""
    kernel_release: ShortText
    """Running kernel, as `uname -r`: `6.18.44-fc-v657-gpu`."""
    machine: Annotated[str, StringConstraints(pattern=r"^[a-z0-9_]{1,32}$")]
    """CPU architecture, as `uname -m`: `x86_64`, `aarch64`."""
    os_id: Annotated[str, StringConstraints(pattern=r"^[a-z0-9._-]{1,64}$")] | None = None
    """`ID` from `/etc/os-release`: `ubuntu`; absent when the host root has no os-release."""
    os_version_id: Annotated[str, StringConstraints(max_length=64)] | None = None
    """`VERSION_ID` from `/etc/os-release`: `24.04`; absent for rolling distributions."""
    product_name: ShortText | None = None
    """Machine model from DMI (`/sys/class/dmi/id/product_name`) or the cloud instance type."""
    boot_id: BootId
    """Boot id when the inventory was taken."""
    driver_version: Version | None = None
    """Loaded NVIDIA kernel driver version (`580.159.04`); absent when none is loaded."""
    driver_flavour: Flavour | None = None
    """Which module tree the loaded NVIDIA driver is: `open` when `/proc/driver/nvidia/version`
    says "Open Kernel Module" (as the recorded H200 host's does), else `proprietary`; absent
    when none is loaded."""
    cuda_driver_version: Version | None = None
    """Highest CUDA version the loaded driver supports (`13.0`); absent without a driver."""
    ofed_version: Version | None = None
    """Loaded Mellanox OFED (DOCA) driver version; absent when the inbox driver or none runs."""
    modules_loaded: tuple[ModuleName, ...] = Field(default=(), max_length=256)
    """Loaded kernel modules of the managed drivers (`nvidia*`, `mlx5_*`, `ib_*`, ...), sorted."""
    container_runtimes: tuple[ContainerRuntime, ...] = Field(default=(), max_length=4)
    """Every container runtime installed on the node, containerd first; empty when none is
    (and in inventories from before gpuop read runtimes)."""
    cdi_specs: tuple[CdiSpec, ...] = Field(default=(), max_length=64)
    """Every CDI spec file of kind `nvidia.com/gpu` and every malformed spec file, `/etc/cdi`
    first, then `/var/run/cdi`, by name; empty when there is none."""
    inventory_hash: Sha256
    """SHA-256 of every other field, from `content_hash()`: equal hashes, equal inventories."""

    def content_hash(self) -> str:
        """The value `inventory_hash` must have: a digest of the canonical JSON of the rest.

        Producers build the inventory with any placeholder hash and publish
        `inventory.model_copy(update={"inventory_hash": inventory.content_hash()})`. Fields
        added later are left out while they hold their default, so an inventory without them
        hashes as it did before they existed (recorded logs replay with the same hashes).
        """
        fields = self.model_dump(mode="json", exclude={"inventory_hash"})
        for name in ADDED_FIELDS:
            if fields.get(name) in ((), [], None):
                fields.pop(name, None)
        for gpu in fields.get("gpus", ()):
            for name in ADDED_GPU_FIELDS:
                if gpu.get(name) in ((), [], None):
                    gpu.pop(name, None)
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


class HardwareHeartbeat(Event):
    """Discovery is alive on the node; carries enough to notice a missed inventory or reboot."""

    DOMAIN: ClassVar[str] = "hardware"
    NAME: ClassVar[str] = "heartbeat"

    boot_id: BootId
    """Current boot id; differs from the last inventory's after a reboot."""
    inventory_hash: Sha256
    """Hash of the inventory discovery last published."""
    uptime_seconds: Seconds
    """Seconds since the node booted."""
    gpu_count: Count
    """GPUs NVML sees now."""


class RescanHardware(Command):
    """Discovery must take and publish a fresh inventory now, even if nothing changed."""

    SERVICE: ClassVar[str] = "discovery"
    VERB: ClassVar[str] = "rescan"

    reason: Message = ""
    """Why the rescan was asked for, for the log."""
