"""The RDMA inventory from sysfs: devices, ports, their state, link layer and netdev."""

from __future__ import annotations

import os
from pathlib import Path

from gpuop.events import network as events
from gpuop.host.roots import HostRoot
from gpuop.services.network_manager import rdma
from gpuop_sim.cluster import nics
from tests.support.networks import DATA_NIC, MANAGEMENT_NIC, connectx_host


def test_each_connectx_port_is_listed_with_its_state_link_layer_and_netdev(tmp_path: Path) -> None:
    root = connectx_host(tmp_path, (MANAGEMENT_NIC, DATA_NIC))

    found = rdma.inventory(root, [MANAGEMENT_NIC])

    assert [device.name for device in found.devices] == ["mlx5_0", "mlx5_1"]
    device = found.devices[1]
    assert (device.pci_address, device.driver) == ("0000:41:00.0", "mlx5_core")
    (port,) = device.ports
    assert port.number == 1
    assert port.state is events.RdmaPortState.ACTIVE
    assert port.link_layer is events.RdmaLinkLayer.ETHERNET
    assert port.netdev == DATA_NIC
    assert port.rate == "400 Gb/sec (4X NDR)"
    assert found.management_interfaces == (MANAGEMENT_NIC,)


def test_an_infiniband_port_that_is_down_and_has_no_gid_takes_its_netdev_from_the_function(
    tmp_path: Path,
) -> None:
    root = HostRoot(tmp_path)
    nics.add_connectx(
        root, "0000:41:00.0", "ibp65s0", port_state="1: DOWN", link_layer="InfiniBand"
    )
    port = root.join("sys/devices/pci0000:00/0000:41:00.0/infiniband/mlx5_0/ports/1")
    os.unlink(port / "gid_attrs/ndevs/0")

    (device,) = rdma.inventory(root).devices

    (found,) = device.ports
    assert found.state is events.RdmaPortState.DOWN
    assert found.link_layer is events.RdmaLinkLayer.INFINIBAND
    assert found.netdev == "ibp65s0"


def test_a_host_without_rdma_devices_has_an_empty_inventory(recorded: HostRoot) -> None:
    assert rdma.inventory(recorded) == events.RdmaDevicesDiscovered()
