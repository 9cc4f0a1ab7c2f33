"""The node's RDMA devices, read from `sys/class/infiniband` under the host root, as the
`network.rdma-discovered` inventory the node agent publishes when it changes.

For each device `mlx5_0`, sysfs gives:

    device                         link to the PCI function (none for a software device)
    ports/<n>/state                "4: ACTIVE"
    ports/<n>/link_layer           "Ethernet" (RoCE) or "InfiniBand"
    ports/<n>/rate                 "400 Gb/sec (4X NDR)"
    ports/<n>/gid_attrs/ndevs/0    the port's netdev, when its first GID is in use
    device/net/<ifname>/dev_port   which port (from 0) each netdev of the function serves

A port's netdev is the one its first GID names, else the function's netdev serving it. The
inventory also names the management interfaces an OFED reload would reset: the caller
works those out (`gpuop.host.netdevs.management_interfaces`) and passes them in.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuop.events import network
from gpuop.host import pci
from gpuop.host.errors import HostReadError
from gpuop.host.roots import HostRoot

INFINIBAND = "sys/class/infiniband"
"""Where sysfs lists the RDMA devices."""

STATES = {
    "DOWN": network.RdmaPortState.DOWN,
    "INIT": network.RdmaPortState.INIT,
    "ARMED": network.RdmaPortState.ARMED,
    "ACTIVE": network.RdmaPortState.ACTIVE,
    "ACTIVE_DEFER": network.RdmaPortState.ACTIVE_DEFER,
}
LINK_LAYERS = {
    "ethernet": network.RdmaLinkLayer.ETHERNET,
    "infiniband": network.RdmaLinkLayer.INFINIBAND,
}


def inventory(
    root: HostRoot, management_interfaces: Iterable[str] = ()
) -> network.RdmaDevicesDiscovered:
    """Every RDMA device under the host root, by name (none on a host without any).

    Raises `HostReadError` when a device's files exist but cannot be read."""
    return network.RdmaDevicesDiscovered(
        devices=tuple(device(root, name) for name in root.list_dir(INFINIBAND)),
        management_interfaces=tuple(sorted(set(management_interfaces))),
    )


def device(root: HostRoot, name: str) -> network.RdmaDevice:
    """The RDMA device `name` and its ports."""
    base = f"{INFINIBAND}/{name}"
    address = _pci_address(root, base)
    netdevs = _netdevs_by_port(root, base)
    ports = []
    for entry in root.list_dir(f"{base}/ports"):
        if not entry.isdigit():
            continue
        port = f"{base}/ports/{entry}"
        layer = (_text(root, f"{port}/link_layer") or "").lower()
        ports.append(
            network.RdmaPort(
                number=int(entry),
                state=STATES.get(_state(root, f"{port}/state"), network.RdmaPortState.UNKNOWN),
                link_layer=LINK_LAYERS.get(layer, network.RdmaLinkLayer.UNKNOWN),
                netdev=_gid_netdev(root, port) or netdevs.get(int(entry)),
                rate=_text(root, f"{port}/rate"),
            )
        )
    return network.RdmaDevice(
        name=name,
        pci_address=address,
        driver=pci.bound_driver(root, address) if address else None,
        ports=tuple(sorted(ports, key=lambda port: port.number)),
    )


def _pci_address(root: HostRoot, base: str) -> str | None:
    target = root.link_target(f"{base}/device")
    if target is None:
        return None
    last = target.rstrip("/").rpartition("/")[2]
    return last if root.exists(f"{pci.DEVICES}/{last}") else None


def _netdevs_by_port(root: HostRoot, base: str) -> dict[int, str]:
    """The PCI function's netdevs by the port they serve (`dev_port` + 1)."""
    found: dict[int, str] = {}
    for name in root.list_dir(f"{base}/device/net"):
        text = _text(root, f"{base}/device/net/{name}/dev_port")
        port = int(text) + 1 if text is not None and text.isdigit() else 1
        found.setdefault(port, name)
    return found


def _gid_netdev(root: HostRoot, port: str) -> str | None:
    try:
        return _text(root, f"{port}/gid_attrs/ndevs/0")
    except HostReadError:
        return None  # the kernel answers EINVAL for a GID that is not in use


def _state(root: HostRoot, relative: str) -> str:
    """`4: ACTIVE` -> `ACTIVE`."""
    text = _text(root, relative) or ""
    return text.partition(":")[2].strip() if ":" in text else text


def _text(root: HostRoot, relative: str) -> str | None:
    text = root.read_text(relative)
    if text is None:
        return None
    return text.strip() or None
