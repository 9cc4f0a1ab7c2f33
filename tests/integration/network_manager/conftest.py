"""Simulated nodes for network-manager's node role: each a real network namespace with veth
pairs standing in for its NICs (this kernel has no dummy driver), and a host root whose
sysfs says they are ConnectX ports. The management NIC carries an address and the
namespace's default route. Every namespace a test makes is deleted after it, pass or fail,
and deleting a namespace deletes every link in it. Needs root and iproute2; fails without."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuop.bus import Buckets, Bus, InMemoryBus, KeyValue
from gpuop.events import Payload, decode, subjects
from gpuop.host.roots import HostRoot
from gpuop.policy import NetworkSpec, PublishedNetwork
from gpuop.policy.networks import CONFIG_KEY
from gpuop.services.network_manager.addressing import Addresses
from gpuop.services.network_manager.applying import NodeNetworks
from gpuop.services.network_manager.config import NetworkManagerConfig
from gpuop.services.network_manager.node_agent import NodeAgent
from tests.support.networks import (
    DATA_NIC,
    MANAGEMENT_NIC,
    SECOND_NIC,
    connectx_host,
)

MANAGEMENT_ADDRESS = "10.0.0.2/24"


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


@dataclass
class SimNode:
    """One simulated node: its name, network namespace and host root."""

    name: str
    netns: str
    root: HostRoot

    def ip(self, *args: str) -> str:
        return _ip("-n", self.netns, *args)

    def link(self, name: str) -> dict[str, Any] | None:
        """`ip -details link show` of `name` as JSON, with its addresses; None if absent."""
        try:
            (link,) = json.loads(self.ip("-j", "-d", "addr", "show", "dev", name))
        except RuntimeError:
            return None
        assert isinstance(link, dict)
        return link

    def links(self) -> dict[str, dict[str, Any]]:
        return {link["ifname"]: link for link in json.loads(self.ip("-j", "-d", "addr", "show"))}

    def layout(self) -> dict[str, tuple[object, ...]]:
        """What gpuop may change of each link: index, MTU, admin state, kind, parent, mode,
        alias, addresses. Carrier and operational state are left out: the kernel settles
        those on its own a moment after a change."""
        return {
            name: (
                link["ifindex"],
                link["mtu"],
                "UP" in link["flags"],
                link.get("linkinfo", {}).get("info_kind"),
                link.get("link"),
                link.get("linkinfo", {}).get("info_data", {}).get("mode"),
                link.get("ifalias"),
                tuple(addresses_of(link)),
            )
            for name, link in self.links().items()
        }

    def networks(self, ipam: KeyValue) -> NodeNetworks:
        """The node role's networks on this node, claiming from `ipam`."""
        return NodeNetworks(self.root, self.netns, Addresses(ipam, self.name))


def addresses_of(link: dict[str, Any]) -> list[str]:
    return [
        f"{entry['local']}/{entry['prefixlen']}"
        for entry in link.get("addr_info", [])
        if entry.get("scope") == "global"
    ]


@pytest.fixture
def make_node(tmp_path: Path) -> Iterator[Callable[[str], SimNode]]:
    """Makes simulated nodes; deletes their namespaces afterwards, whatever happened."""
    if os.geteuid() != 0:
        pytest.fail("creating network namespaces needs root: run the tests as root (CI does)")
    if shutil.which("ip") is None:
        pytest.fail("iproute2 is not installed: apt-get install -y iproute2")
    created: list[str] = []

    def make(name: str) -> SimNode:
        netns = f"gpuop-test-{uuid.uuid4().hex[:10]}"
        _ip("netns", "add", netns)
        created.append(netns)
        node = SimNode(name, netns, connectx_host(tmp_path / name))
        for nic in (MANAGEMENT_NIC, DATA_NIC, SECOND_NIC):
            node.ip("link", "add", nic, "type", "veth", "peer", "name", f"{nic}p")
        node.ip("link", "set", MANAGEMENT_NIC, "up")
        node.ip("addr", "add", MANAGEMENT_ADDRESS, "dev", MANAGEMENT_NIC)
        node.ip("route", "add", "default", "via", "10.0.0.1")
        return node

    try:
        yield make
    finally:
        for netns in created:
            subprocess.run(["ip", "netns", "del", netns], check=False)


@pytest.fixture
async def ipam(bus: InMemoryBus) -> KeyValue:
    return await bus.kv(Buckets.IPAM)


async def publish_policy(bus: Bus, section: NetworkSpec, generation: int = 1) -> int:
    """Publish `section` as the cluster role does; returns the entry's revision."""
    kv = await bus.kv(Buckets.CONFIG)
    published = PublishedNetwork(policy="default", generation=generation, spec=section)
    return await kv.put(CONFIG_KEY, published.encode())


async def network_events(bus: Bus) -> list[tuple[str, Payload]]:
    """Every network event stored so far, with the node it is about."""
    found = []
    async for stored in bus.read(subjects.events_filter("network", prefix=bus.prefix)):
        envelope, payload = decode(stored.data)
        found.append((envelope.node, payload))
    return found


def agent(bus: Bus, node: SimNode, ipam: KeyValue, **config: Any) -> NodeAgent:
    """The node role's agent on `node`, with quick retries."""
    settings = NetworkManagerConfig(netns=node.netns, retry_interval_seconds=0.05, **config)
    return NodeAgent(bus, node.name, node.root, settings, node.networks(ipam))
