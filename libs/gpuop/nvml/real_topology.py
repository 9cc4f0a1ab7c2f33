"""NVLinks and GPU-to-GPU topology read through pynvml, for `PynvmlBackend`.

A GPU's links are numbered from 0; NVML answers InvalidArgument past the last one, and
NotSupported for every link of a GPU without NVLink (the recorded H200 VM does). Whether two
GPUs talk over NVLink comes from the P2P status NVML reports for the NVLink capability,
which covers both direct links and NVSwitch fabrics.
"""

from __future__ import annotations

from typing import Any

from gpuop.nvml.binding import Binding, text
from gpuop.nvml.errors import InvalidArgument, NotSupported
from gpuop.nvml.topology import NVLINK_REMOTES, NvLink, NvLinkRemote, PcieLevel, PeerTopology


def read_nvlinks(nvml: Binding, handle: Any) -> tuple[NvLink, ...]:
    """The GPU's NVLinks, active or not; empty without NVLink."""
    links = []
    for link in range(nvml.constant("NVML_NVLINK_MAX_LINKS")):
        try:
            state = nvml.call("nvmlDeviceGetNvLinkState", handle, link)
        except NotSupported:
            continue
        except InvalidArgument:
            break  # past this GPU's last link
        if int(state) != nvml.constant("NVML_FEATURE_ENABLED"):
            links.append(NvLink(link, False, None, NvLinkRemote.UNKNOWN, None))
            continue
        version = nvml.optional("nvmlDeviceGetNvLinkVersion", handle, link)
        remote = nvml.optional("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        pci = nvml.optional("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        links.append(
            NvLink(
                link=link,
                active=True,
                version=None if version is None else int(version),
                remote=NvLinkRemote.UNKNOWN if remote is None else _remote(int(remote)),
                remote_pci_bus_id=None if pci is None else text(pci.busId),
            )
        )
    return tuple(links)


def read_topology(nvml: Binding, index: int, handle: Any, peer: int, other: Any) -> PeerTopology:
    """PCIe proximity and NVLink reachability of two GPUs; a GPU with itself is INTERNAL."""
    if index == peer:
        return PeerTopology(index, peer, PcieLevel.INTERNAL, nvlink=False)
    level = nvml.optional("nvmlDeviceGetTopologyCommonAncestor", handle, other)
    p2p = nvml.optional(
        "nvmlDeviceGetP2PStatus", handle, other, nvml.constant("NVML_P2P_CAPS_INDEX_NVLINK")
    )
    return PeerTopology(
        index=index,
        peer=peer,
        pcie_level=None if level is None else _pcie_level(int(level)),
        nvlink=p2p is not None and int(p2p) == nvml.constant("NVML_P2P_STATUS_OK"),
    )


def _remote(kind: int) -> NvLinkRemote:
    return NVLINK_REMOTES.get(kind, NvLinkRemote.UNKNOWN)


def _pcie_level(level: int) -> PcieLevel | None:
    try:
        return PcieLevel(level)
    except ValueError:
        return None
