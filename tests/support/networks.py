"""Policies and hosts for network-manager's tests: a network in the policy's wire form, a
host root with ConnectX NICs, and a snapshot of links built by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuop.host.roots import HostRoot
from gpuop.policy import NetworkSpec, SecondaryNetwork
from gpuop_sim.cluster import nics

DATA_NIC = "ens1f0"
"""A ConnectX port free for secondary networks."""
SECOND_NIC = "ens2f0"
"""Another ConnectX port."""
MANAGEMENT_NIC = "eno1"
"""A ConnectX port carrying the default route; it sorts before the others on purpose."""
ADDRESSES = {MANAGEMENT_NIC: "0000:40:00.0", DATA_NIC: "0000:41:00.0", SECOND_NIC: "0000:42:00.0"}
RDMA = {MANAGEMENT_NIC: "mlx5_0", DATA_NIC: "mlx5_1", SECOND_NIC: "mlx5_2"}


def wire(name: str = "roce-a", **fields: Any) -> dict[str, Any]:
    """A secondary network as the policy spells it: macvlan on the data NIC, a /24 pool."""
    network: dict[str, Any] = {
        "name": name,
        "master": {"interface": DATA_NIC},
        "ipam": {"cidr": "192.168.100.0/24"},
    }
    network.update(fields)
    return network


def network(name: str = "roce-a", **fields: Any) -> SecondaryNetwork:
    return SecondaryNetwork.model_validate(wire(name, **fields))


def spec(*networks: dict[str, Any], **section: Any) -> NetworkSpec:
    return NetworkSpec.model_validate({"networks": list(networks), **section})


def connectx_host(path: Path, names: tuple[str, ...] = tuple(ADDRESSES)) -> HostRoot:
    """A host root whose sysfs shows ConnectX-7 ports with these netdev names."""
    root = HostRoot(path)
    path.mkdir(parents=True, exist_ok=True)
    for name in names:
        nics.add_connectx(root, ADDRESSES[name], name, rdma_device=RDMA[name])
    return root
