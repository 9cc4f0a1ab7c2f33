"""How a simulated node's GPUs are wired, modelled on an HGX H200 baseboard.

Each baseboard holds up to 8 GPUs, every one with 18 NVLink 4 links spread over 4 NVSwitches
(5, 4, 4 and 5 links), so all GPUs of a board reach each other over NVLink; a node with one
GPU has none, like a PCIe card. On PCIe, GPUs sit in pairs behind a switch (`MULTIPLE`),
pairs of one NUMA node meet at that node (`NODE`), and the two NUMA nodes meet over the CPU
interconnect (`SYSTEM`).
"""

from __future__ import annotations

from gpuop.nvml.topology import NvLink, NvLinkRemote, PcieLevel, PeerTopology
from gpuop_sim.nvml.sim_gpus import numa_node

GPUS_PER_BOARD = 8
LINKS_PER_GPU = 18
NVLINK_VERSION = 4
_LINKS_PER_SWITCH = (5, 4, 4, 5)


def has_nvlink(gpus: int) -> bool:
    """A node with more than one GPU is an HGX node; one GPU is a PCIe card."""
    return gpus > 1


def nvlinks(index: int, gpus: int) -> tuple[NvLink, ...]:
    """The links of GPU `index`: all to the NVSwitches of its baseboard."""
    if not has_nvlink(gpus):
        return ()
    board = index // GPUS_PER_BOARD
    switches = [switch for switch, count in enumerate(_LINKS_PER_SWITCH) for _ in range(count)]
    return tuple(
        NvLink(
            link=link,
            active=True,
            version=NVLINK_VERSION,
            remote=NvLinkRemote.SWITCH,
            remote_pci_bus_id=f"00000001:{board * len(_LINKS_PER_SWITCH) + switch:02X}:00.0",
        )
        for link, switch in enumerate(switches)
    )


def topology(index: int, peer: int, gpus: int) -> PeerTopology:
    """PCIe proximity and NVLink reachability of two simulated GPUs."""
    if index == peer:
        return PeerTopology(index, peer, PcieLevel.INTERNAL, nvlink=False)
    if index // 2 == peer // 2:
        level = PcieLevel.MULTIPLE
    elif numa_node(index, gpus) == numa_node(peer, gpus):
        level = PcieLevel.NODE
    else:
        level = PcieLevel.SYSTEM
    same_board = index // GPUS_PER_BOARD == peer // GPUS_PER_BOARD
    return PeerTopology(index, peer, level, nvlink=has_nvlink(gpus) and same_board)
