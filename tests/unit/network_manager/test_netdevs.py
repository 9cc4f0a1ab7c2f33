"""`gpuop.host.netdevs`: which default-route interfaces an OFED reload would take down, from
the host root as driver-manager sees it."""

from __future__ import annotations

import os
from pathlib import Path

from gpuop.host import components, netdevs
from gpuop.host.roots import HostRoot
from gpuop_sim.cluster import nics
from tests.support.networks import DATA_NIC, MANAGEMENT_NIC, connectx_host

OFED = components.modules_of(components.OFED)


def test_a_default_route_on_a_connectx_port_is_cut_off_by_an_ofed_reload(tmp_path: Path) -> None:
    root = connectx_host(tmp_path, (MANAGEMENT_NIC, DATA_NIC))
    nics.route_default_via(root, MANAGEMENT_NIC)

    assert netdevs.reload_cuts_off(root, OFED) == (MANAGEMENT_NIC,)
    assert netdevs.reload_cuts_off(root, components.modules_of(components.GPU)) == ()


def test_a_default_route_elsewhere_or_unknown_is_not_cut_off(tmp_path: Path) -> None:
    root = connectx_host(tmp_path, (DATA_NIC,))

    assert netdevs.reload_cuts_off(root, OFED) == ()
    nics.route_default_via(root, "eth0")
    assert netdevs.reload_cuts_off(root, OFED) == ()


def test_a_default_route_on_a_bond_of_connectx_ports_is_cut_off(tmp_path: Path) -> None:
    root = connectx_host(tmp_path, (MANAGEMENT_NIC, DATA_NIC))
    bond = root.join("sys/devices/virtual/net/bond0")
    (bond / "bonding").mkdir(parents=True)
    (bond / "bonding/slaves").write_text(f"{MANAGEMENT_NIC} {DATA_NIC}\n")
    os.symlink("../../devices/virtual/net/bond0", root.join("sys/class/net/bond0"))
    nics.route_default_via(root, "bond0")

    assert netdevs.net_device(root, "bond0").lower == (MANAGEMENT_NIC, DATA_NIC)
    assert netdevs.reload_cuts_off(root, OFED) == ("bond0",)


def test_the_recorded_hosts_virtio_nic_is_read_from_its_recorded_link(recorded: HostRoot) -> None:
    eth0 = netdevs.net_devices(recorded)["eth0"]

    assert eth0.pci_address == "0000:00:03.0"
    assert eth0.vendor_id == "1af4"
    assert netdevs.net_devices(recorded)["lo"].pci_address is None


def test_an_ipv6_default_route_counts_and_the_loopback_entry_does_not(tmp_path: Path) -> None:
    root = connectx_host(tmp_path, (MANAGEMENT_NIC, DATA_NIC))
    zero = "0" * 32
    root.join("proc/net").mkdir(parents=True)
    root.join("proc/net/ipv6_route").write_text(
        f"{zero} 00 {zero} 00 fe800000000000000000000000000001 00000400 00000001 00000000 "
        f"00000003 {DATA_NIC}\n"
        f"{zero} 00 {zero} 00 {zero} ffffffff 00000001 00000000 00200200       lo\n"
    )

    assert netdevs.default_route_interfaces(root) == {DATA_NIC}
    assert netdevs.reload_cuts_off(root, OFED) == (DATA_NIC,)
