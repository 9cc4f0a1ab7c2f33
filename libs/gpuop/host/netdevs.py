"""The host's network devices, and which of them carry the node's management traffic.

Every NIC an OFED reload resets is a netdev on a PCI function bound to an OFED module
(`mlx5_core`). When the default route leaves through such a NIC (directly, or through a
bond, bridge or VLAN stacked on it) the reload cuts the node off the network until the
driver is back (Mellanox/network-operator#2176, #2258). Two callers ask that question:

- driver-manager, before it unloads OFED: `reload_cuts_off(root, modules)`, from the host
  root alone (sysfs for the devices, `proc/net/route` and `proc/net/ipv6_route` for the
  default route; the pod shares the host's network namespace);
- network-manager's node role, which must never reconfigure that NIC and reports the
  answer in `network.rdma-discovered`: it reads the default route and the stacking from
  netlink, the PCI facts from sysfs (`net_device`), and calls the pure
  `management_interfaces` with them.

`NetDevice` is plain data, so either source can build it; `beneath` follows the stacking
(`lower` links: bond slaves, bridge ports, the NIC under a VLAN or macvlan) down to the NICs.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from gpuop.host import pci
from gpuop.host.roots import HostRoot

NET = "sys/class/net"
"""Where sysfs lists the network devices of the host's network namespace."""

_ROUTE = "proc/net/route"
_ROUTE6 = "proc/net/ipv6_route"
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(frozen=True)
class NetDevice:
    """One network device: what it sits on, and the PCI function behind it, if any."""

    name: str
    """Interface name: `enp65s0f0np0`, `bond0`."""
    pci_address: str | None = None
    """The PCI function under it (`0000:41:00.0`); None for a virtual device."""
    vendor_id: str | None = None
    """PCI vendor id as four lowercase hex digits (`15b3`); None without a PCI function."""
    device_id: str | None = None
    """PCI device id as four lowercase hex digits (`101e`)."""
    driver: str | None = None
    """Driver bound to the PCI function (`mlx5_core`); None when unbound or virtual."""
    lower: tuple[str, ...] = ()
    """Devices it is stacked on: a bond's slaves, a bridge's ports, a VLAN's parent."""


def net_device(root: HostRoot, name: str) -> NetDevice:
    """What sysfs says of the device `name` (a bare record when sysfs does not know it)."""
    address = _pci_address(root, name)
    lower = {
        entry.removeprefix("lower_")
        for entry in root.list_dir(f"{NET}/{name}")
        if entry.startswith("lower_")
    }
    lower.update((root.read_text(f"{NET}/{name}/bonding/slaves") or "").split())
    if address is None:
        return NetDevice(name, lower=tuple(sorted(lower)))
    return NetDevice(
        name,
        pci_address=address,
        vendor_id=_pci_id(root, address, "vendor"),
        device_id=_pci_id(root, address, "device"),
        driver=pci.bound_driver(root, address),
        lower=tuple(sorted(lower)),
    )


def net_devices(root: HostRoot) -> dict[str, NetDevice]:
    """Every network device sysfs lists, by name."""
    return {name: net_device(root, name) for name in root.list_dir(NET)}


def default_route_interfaces(root: HostRoot) -> frozenset[str]:
    """Interfaces with an IPv4 or IPv6 default route, from the host root's procfs; empty
    when procfs cannot tell."""
    found: set[str] = set()
    for line in (root.read_text(_ROUTE) or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[1] == "00000000" and fields[7] == "00000000":
            found.add(fields[0])
    for line in (root.read_text(_ROUTE6) or "").splitlines():
        fields = line.split()
        if len(fields) >= 10 and fields[0] == "0" * 32 and fields[1] == "00" and fields[9] != "lo":
            found.add(fields[9])
    return frozenset(found)


def beneath(devices: Mapping[str, NetDevice], names: Iterable[str]) -> frozenset[str]:
    """`names` and every device they are stacked on, however deep."""
    seen: set[str] = set()
    pending = list(names)
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        device = devices.get(name)
        if device is not None:
            pending.extend(device.lower)
    return frozenset(seen)


def management_interfaces(
    devices: Mapping[str, NetDevice], default_routes: Iterable[str], drivers: Collection[str]
) -> tuple[str, ...]:
    """The default-route interfaces that a reload of `drivers` would reset: those on (or
    stacked on) a NIC whose PCI function one of `drivers` drives. Sorted."""
    found = []
    for interface in sorted(set(default_routes)):
        below = beneath(devices, [interface])
        if any(devices[name].driver in drivers for name in below if name in devices):
            found.append(interface)
    return tuple(found)


def reload_cuts_off(root: HostRoot, drivers: Collection[str]) -> tuple[str, ...]:
    """The host's default-route interfaces that reloading `drivers` (the modules of a
    driver stack, such as OFED's `mlx5_core`, `ib_core`, `mlx5_ib`) would take down; empty
    when none would, or when the host root shows no default route."""
    routes = default_route_interfaces(root)
    if not routes:
        return ()
    return management_interfaces(net_devices(root), routes, drivers)


def _pci_address(root: HostRoot, name: str) -> str | None:
    """The PCI function under `name`, from where its `sys/class/net` link points."""
    target = root.link_target(f"{NET}/{name}")
    if target is None:
        return None
    addresses = [part for part in PurePosixPath(target).parts if _PCI_ADDRESS.match(part)]
    return addresses[-1] if addresses else None


def _pci_id(root: HostRoot, address: str, which: str) -> str | None:
    text = (root.read_text(f"{pci.DEVICES}/{address}/{which}") or "").strip().lower()
    return text.removeprefix("0x").zfill(4) if text else None
