"""How GPUs are wired: their NVLinks and the PCIe path between two of them.

The device plugin's `GetPreferredAllocation` prefers GPU sets on one NUMA node and joined by
NVLink; it reads `Nvml.nvlinks()` and `Nvml.topology()` once per session, since wiring does
not change while a driver is loaded. A GPU without NVLink (PCIe cards, the recorded H200 VM,
whose every NVLink query answers NotSupported) has no links, and pairs report
`nvlink=False`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class NvLinkRemote(enum.StrEnum):
    """What the far end of an NVLink is (`NVML_NVLINK_DEVICE_TYPE_*`)."""

    GPU = "gpu"
    """Another GPU, linked directly."""
    IBMNPU = "ibmnpu"
    """An IBM POWER NPU."""
    SWITCH = "switch"
    """An NVSwitch: every GPU on the same switch fabric is reachable (HGX boards)."""
    UNKNOWN = "unknown"
    """The driver does not say."""


NVLINK_REMOTES: dict[int, NvLinkRemote] = {
    0x00: NvLinkRemote.GPU,
    0x01: NvLinkRemote.IBMNPU,
    0x02: NvLinkRemote.SWITCH,
}
"""`nvmlDeviceGetNvLinkRemoteDeviceType` values; anything else is `UNKNOWN`."""


class PcieLevel(enum.IntEnum):
    """Closest common PCIe ancestor of two GPUs (`nvmlGpuTopologyLevel_t`), nearest first."""

    INTERNAL = 0
    """The same board (or the same GPU)."""
    SINGLE = 10
    """One PCIe switch between them (`PIX` in `nvidia-smi topo -m`)."""
    MULTIPLE = 20
    """Several PCIe switches, no host bridge (`PXB`)."""
    HOSTBRIDGE = 30
    """The same host bridge (`PHB`)."""
    NODE = 40
    """The same NUMA node, across host bridges (`NODE`)."""
    SYSTEM = 50
    """Across NUMA nodes, over the CPU interconnect (`SYS`)."""


@dataclass(frozen=True, slots=True)
class NvLink:
    """One NVLink of a GPU."""

    link: int
    """Link number on this GPU, from 0."""
    active: bool
    """The link is up."""
    version: int | None
    """NVLink generation (4 on Hopper); `None` when the link is down or it is unknown."""
    remote: NvLinkRemote
    """What the link reaches."""
    remote_pci_bus_id: str | None
    """PCI address of the far end (a GPU or an NVSwitch); `None` when down or unknown."""


@dataclass(frozen=True, slots=True)
class PeerTopology:
    """How two GPUs of one node reach each other."""

    index: int
    """NVML index of the first GPU."""
    peer: int
    """NVML index of the second GPU."""
    pcie_level: PcieLevel | None
    """Their closest common PCIe ancestor; `None` when NVML cannot tell."""
    nvlink: bool
    """Peer-to-peer over NVLink works between them (directly or through NVSwitches)."""
