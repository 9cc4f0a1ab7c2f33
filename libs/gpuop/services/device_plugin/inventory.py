"""The node's GPUs as the device plugin hands them out: read once per NVML session.

`read_inventory` (called by `plugins.DevicePlugins` in a worker thread, with the session
open) turns NVML's answers into `Target`s, the things one allocated device id gives a
container: a whole GPU or a MIG device, with its UUID, NUMA node and device nodes. NVML
does not know the NUMA node on every platform (the recorded H200 VM answers NotSupported),
so sysfs is asked then, as upstream does. It also scores how well each pair of GPUs is
wired, for `preferring`, and notes which NVIDIA control device nodes the host has.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuop.host import cdi, pci
from gpuop.host.errors import HostReadError
from gpuop.host.roots import HostRoot
from gpuop.nvml import Nvml, NvmlError, PcieLevel
from gpuop.nvml.devices import DeviceInfo
from gpuop.nvml.mig import MigDevice

CONTROL_DEVICES = cdi.CONTROL_DEVICES
"""Device nodes every GPU container needs besides its GPUs', handed out when present."""

PCIE_SCORES = {
    PcieLevel.INTERNAL: 60,
    PcieLevel.SINGLE: 50,
    PcieLevel.MULTIPLE: 40,
    PcieLevel.HOSTBRIDGE: 30,
    PcieLevel.NODE: 20,
    PcieLevel.SYSTEM: 10,
}
"""How close two GPUs are over PCIe, scored as NVIDIA's go-gpuallocator scores them."""
NVLINK_SCORE = 100
"""Added for a pair that talks peer-to-peer over NVLink."""
SAME_GPU_SCORE = PCIE_SCORES[PcieLevel.INTERNAL]
"""Two MIG devices of one GPU are as close as devices can be."""


@dataclass(frozen=True)
class Target:
    """A whole GPU or one MIG device: what a container is given for one device id."""

    uuid: str
    """`GPU-...` or `MIG-...`: the name NVIDIA_VISIBLE_DEVICES and CDI use."""
    gpu_uuid: str
    """The physical GPU; health is per physical GPU."""
    gpu_index: int
    """NVML index of the physical GPU."""
    numa_node: int | None
    """NUMA node of the physical GPU; None where the platform does not say."""
    device_nodes: tuple[str, ...]
    """Host device nodes: `/dev/nvidia<minor>`, plus the MIG capability nodes."""
    profile: str | None = None
    """MIG profile (`1g.18gb`); None for a whole GPU."""
    full_compute: bool = True
    """For a MIG device: its compute instance spans its whole GPU instance."""
    memory_bytes: int = 0
    """Framebuffer memory of a whole GPU (MPS divides it among its clients); 0 for a MIG
    device."""


@dataclass(frozen=True)
class Gpu:
    """A physical GPU and the MIG devices carved out of it."""

    whole: Target
    """The GPU as one device."""
    mig_enabled: bool
    """MIG mode is on."""
    mig_devices: tuple[Target, ...]
    """Its MIG devices, in NVML's order; empty while MIG is off."""


@dataclass(frozen=True)
class GpuInventory:
    """Every GPU of the node, how they are wired, and the control device nodes present."""

    gpus: tuple[Gpu, ...]
    pair_scores: dict[tuple[int, int], int]
    """Link score of each pair of GPU indices, smaller index first."""
    control_nodes: tuple[str, ...]
    """The `CONTROL_DEVICES` the host has."""
    cdi_names: Mapping[str, str] = field(default_factory=dict)
    """The node's complete CDI spec (the driver-manager's `nvidia.com/gpu`, with the driver's
    files): the qualified name of each of its devices, by device name (UUIDs among them);
    empty where the node has none."""

    def score(self, a: Target, b: Target) -> int:
        """How well two targets are linked; higher is better."""
        if a.gpu_index == b.gpu_index:
            return SAME_GPU_SCORE
        low, high = sorted((a.gpu_index, b.gpu_index))
        return self.pair_scores.get((low, high), 0)


EMPTY = GpuInventory(gpus=(), pair_scores={}, control_nodes=())
"""What is known before NVML answered."""


def read_inventory(nvml: Nvml, root: HostRoot) -> GpuInventory:
    """The node's GPUs; NVML's session must be open. Raises `NvmlError`."""
    infos = [nvml.device_info(index) for index in range(nvml.device_count())]
    gpus = tuple(_gpu(nvml, root, info) for info in infos)
    pair_scores = {
        (a.index, b.index): _pair_score(nvml, a.index, b.index)
        for a, b in itertools.combinations(infos, 2)
    }
    present = tuple(node for node in CONTROL_DEVICES if root.join(node).exists())
    names = cdi.device_names(cdi.spec_path(root))
    return GpuInventory(gpus=gpus, pair_scores=pair_scores, control_nodes=present, cdi_names=names)


def _gpu(nvml: Nvml, root: HostRoot, info: DeviceInfo) -> Gpu:
    numa = info.numa_node if info.numa_node is not None else _sysfs_numa(root, info)
    node = f"/dev/nvidia{info.minor_number}"
    whole = Target(
        info.uuid, info.uuid, info.index, numa, (node,), memory_bytes=info.memory_total_bytes
    )
    enabled = bool(info.mig_mode_current)
    migs = nvml.mig_devices(info.index) if enabled else ()
    return Gpu(whole, enabled, tuple(_mig(root, whole, info.minor_number, m) for m in migs))


def _mig(root: HostRoot, gpu: Target, minor: int, device: MigDevice) -> Target:
    return Target(
        uuid=device.uuid,
        gpu_uuid=gpu.uuid,
        gpu_index=gpu.gpu_index,
        numa_node=gpu.numa_node,
        device_nodes=(*gpu.device_nodes, *_mig_capabilities(root, minor, device)),
        profile=device.profile,
        full_compute=device.compute_instance_slices == device.gpu_instance_slices,
    )


def _mig_capabilities(root: HostRoot, minor: int, device: MigDevice) -> tuple[str, ...]:
    return cdi.mig_capability_nodes(root, minor, device.gpu_instance_id, device.compute_instance_id)


def _sysfs_numa(root: HostRoot, info: DeviceInfo) -> int | None:
    try:
        return pci.pci_function(root, info.sysfs_bus_id).numa_node
    except HostReadError:
        return None


def _pair_score(nvml: Nvml, a: int, b: int) -> int:
    try:
        topology = nvml.topology(a, b)
    except NvmlError:
        return 0
    pcie = PCIE_SCORES.get(topology.pcie_level, 0) if topology.pcie_level is not None else 0
    return pcie + (NVLINK_SCORE if topology.nvlink else 0)
