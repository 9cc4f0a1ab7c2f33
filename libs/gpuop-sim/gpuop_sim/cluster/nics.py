"""ConnectX NICs in a simulated host root: what sysfs and procfs show of a Mellanox port.

The recorded H200 host has no Mellanox function (only `mlx5_*` modules loaded). Tests and
the simulated cluster that need one call `add_connectx`: a PCI function bound to
`mlx5_core`, its netdev in `sys/class/net`, and its RDMA device in `sys/class/infiniband`
with one port, laid out as the kernel lays them out, so `gpuop.host.pci`,
`gpuop.host.netdevs`, network-manager's RDMA inventory and driver-manager's management-NIC
check read them as they read a real node. `route_default_via` makes a netdev carry the
host's default route in `proc/net/route`, the way an OFED reload would cut the node off.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuop.host import pci
from gpuop.host.files import write_atomic
from gpuop.host.roots import HostRoot

MELLANOX = "0x15b3"
CONNECTX_7 = "0x1021"
ETHERNET_CLASS = "0x020000"
ROUTE_HEADER = (
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
)


def add_connectx(
    root: HostRoot,
    address: str,
    netdev: str,
    *,
    rdma_device: str | None = "mlx5_0",
    device_id: str = CONNECTX_7,
    driver: str = "mlx5_core",
    port_state: str = "4: ACTIVE",
    link_layer: str = "Ethernet",
) -> None:
    """A ConnectX port at PCI `address` with the netdev `netdev` and (unless None) the RDMA
    device `rdma_device`, bound to `driver`."""
    function = root.join(f"sys/devices/pci0000:00/{address}")
    for name, value in (
        ("vendor", MELLANOX),
        ("device", device_id),
        ("class", ETHERNET_CLASS),
        ("subsystem_vendor", MELLANOX),
        ("subsystem_device", "0x0023"),
        ("numa_node", "0"),
    ):
        write_atomic(function / name, f"{value}\n")
    write_atomic(function / "uevent", f"DRIVER={driver}\nPCI_SLOT_NAME={address}\n")
    root.join(f"sys/bus/pci/drivers/{driver}").mkdir(parents=True, exist_ok=True)
    _link(function / "driver", f"../../../bus/pci/drivers/{driver}")
    _link(root.join(f"{pci.DEVICES}/{address}"), f"../../../devices/pci0000:00/{address}")
    net = function / "net" / netdev
    for name, value in (("dev_port", "0"), ("mtu", "1500"), ("operstate", "up")):
        write_atomic(net / name, f"{value}\n")
    _link(root.join(f"sys/class/net/{netdev}"), f"../../devices/pci0000:00/{address}/net/{netdev}")
    if rdma_device is None:
        return
    port = function / "infiniband" / rdma_device / "ports" / "1"
    write_atomic(port / "state", f"{port_state}\n")
    write_atomic(port / "phys_state", "5: LinkUp\n")
    write_atomic(port / "link_layer", f"{link_layer}\n")
    write_atomic(port / "rate", "400 Gb/sec (4X NDR)\n")
    write_atomic(port / "gid_attrs" / "ndevs" / "0", f"{netdev}\n")
    _link(function / "infiniband" / rdma_device / "device", "../../../" + address)
    _link(
        root.join(f"sys/class/infiniband/{rdma_device}"),
        f"../../devices/pci0000:00/{address}/infiniband/{rdma_device}",
    )


def route_default_via(root: HostRoot, interface: str, *, gateway: str = "0100000A") -> None:
    """Make `interface` carry the host's IPv4 default route (`proc/net/route`, as the
    kernel writes it: hex, little-endian addresses)."""
    write_atomic(
        root.join("proc/net/route"),
        ROUTE_HEADER
        + f"{interface}\t00000000\t{gateway}\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
        + f"{interface}\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n",
    )


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        return
    os.symlink(target, path)
