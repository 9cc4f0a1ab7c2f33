"""The host's RDMA devices (HCAs), as sysfs lists them under `sys/class/infiniband`.

`rdma.RdmaResource` selects its shared HCAs among these (by PCI vendor and device id,
kernel driver, network interface and link type) and hands a container the character
devices under `/dev/infiniband` that belong to them. Each HCA is read as:

    sys/class/infiniband/<hca>/device                 -> its PCI function
    sys/class/infiniband/<hca>/ports/<n>/link_layer   `InfiniBand` or `Ethernet` (RoCE)
    sys/class/infiniband/<hca>/device/net/<ifname>    its network interfaces
    sys/class/infiniband_verbs/uverbs<n>/ibdev        the HCA of /dev/infiniband/uverbs<n>
    sys/class/infiniband_mad/umad<n>/ibdev            the HCA of /dev/infiniband/umad<n>

Link layers are named as `ip link` names them (`infiniband`, `ether`), which is how the
RDMA shared device plugin's `linkTypes` selector spells them. A host without RDMA devices
(the recorded H200) has none of these directories, and so no HCA.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuop.host import pci
from gpuop.host.errors import HostReadError
from gpuop.host.roots import HostRoot

HCAS = "sys/class/infiniband"
"""One entry per RDMA device, by its name (`mlx5_0`)."""
VERBS = "sys/class/infiniband_verbs"
"""The verbs character devices, `uverbs<n>`."""
MADS = "sys/class/infiniband_mad"
"""The management datagram character devices, `umad<n>`."""
DEVICE_DIR = "/dev/infiniband"
"""Where the character devices are on the host."""
RDMA_CM = f"{DEVICE_DIR}/rdma_cm"
"""The RDMA connection manager, shared by every HCA."""

LINK_TYPES = {"infiniband": "infiniband", "ethernet": "ether"}
"""sysfs `link_layer` values, lowercased, to link types."""


@dataclass(frozen=True)
class Hca:
    """One RDMA device: a ConnectX function, a BlueField, a soft RoCE device."""

    name: str
    """The HCA's name: `mlx5_0`."""
    pci_address: str | None
    """Its PCI function, `0000:3b:00.0`; None for a device without one (soft RoCE)."""
    vendor: str | None
    """PCI vendor id as four lowercase hex digits: `15b3`."""
    device: str | None
    """PCI device id as four lowercase hex digits: `1017`."""
    driver: str | None
    """Kernel driver of the PCI function: `mlx5_core`."""
    link_types: tuple[str, ...]
    """Link type of each port, `infiniband` or `ether`, in port order."""
    interfaces: tuple[str, ...]
    """Network interfaces of its PCI function: `ens1f0`."""
    character_devices: tuple[str, ...]
    """Its `/dev/infiniband/uverbs<n>` and `umad<n>`, sorted."""


def hcas(root: HostRoot) -> tuple[Hca, ...]:
    """Every RDMA device of the host, by name; empty when it has none.
    Raises `HostReadError` when a device's files exist but cannot be read."""
    owned = _character_devices(root)
    return tuple(_hca(root, name, owned.get(name, ())) for name in root.list_dir(HCAS))


def _hca(root: HostRoot, name: str, character_devices: tuple[str, ...]) -> Hca:
    base = f"{HCAS}/{name}"
    target = root.link_target(f"{base}/device")
    address = target.rstrip("/").rpartition("/")[2] if target else ""
    function: pci.PciFunction | None = None
    if address:
        try:
            function = pci.pci_function(root, address)
        except HostReadError:
            function = None  # a soft RoCE device points at no PCI function
    return Hca(
        name=name,
        pci_address=function.address if function else None,
        vendor=f"{function.vendor_id:04x}" if function else None,
        device=f"{function.device_id:04x}" if function else None,
        driver=function.driver if function else None,
        link_types=_link_types(root, base),
        interfaces=root.list_dir(f"{base}/device/net"),
        character_devices=character_devices,
    )


def _link_types(root: HostRoot, base: str) -> tuple[str, ...]:
    types = []
    for port in sorted(root.list_dir(f"{base}/ports"), key=_port_order):
        layer = (root.read_text(f"{base}/ports/{port}/link_layer") or "").strip().lower()
        if layer:
            types.append(LINK_TYPES.get(layer, layer))
    return tuple(types)


def _character_devices(root: HostRoot) -> dict[str, tuple[str, ...]]:
    """`/dev/infiniband/...` paths by the HCA they belong to."""
    owners: dict[str, list[str]] = {}
    for directory in (VERBS, MADS):
        for node in root.list_dir(directory):
            hca = (root.read_text(f"{directory}/{node}/ibdev") or "").strip()
            if hca:
                owners.setdefault(hca, []).append(f"{DEVICE_DIR}/{node}")
    return {hca: tuple(sorted(paths)) for hca, paths in owners.items()}


def _port_order(port: str) -> tuple[int, str]:
    return (int(port), port) if port.isdigit() else (1 << 30, port)
