"""Pure decisions of the node role: which NICs are off limits, which NIC a network stacks
on, which links gpuop owns, and whether an existing link can stay as it is.

`applying.NodeNetworks` calls these with what it read (a netlink `Snapshot`, the host's
sysfs view of each interface) and acts on the answers; nothing here does I/O, so every rule
is tested on plain data.

The management NIC: a default route leaves by some link; that link and everything it is
stacked on (the NIC under a VLAN or macvlan, the slaves of a bond, the ports of a bridge)
carry the node's management traffic. gpuop never stacks a network on any of them, never
changes their MTU or state and never deletes them, unless the policy says
`allowManagementNicReconfigure`.

Ownership: gpuop marks each link it creates with the alias `gpuop:<network>`, and only ever
changes or deletes links so marked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuop.events.network import NetworkFailureReason
from gpuop.host import components, netdevs
from gpuop.host.netdevs import NetDevice
from gpuop.policy import SecondaryNetwork
from gpuop.services.network_manager.netlink import Link, Snapshot

ALIAS_PREFIX = "gpuop:"
"""Start of the alias of every link gpuop owns; the network's name follows."""
STACKED_KINDS = frozenset({"vlan", "macvlan", "macvtap", "ipvlan", "ipvtap", "vxlan"})
"""Link kinds whose IFLA_LINK is the device they send through (for a veth it is the peer)."""
OFED_DRIVERS = frozenset(components.modules_of(components.OFED))


def alias_for(network: str) -> str:
    """The alias that marks a link as the one gpuop made for `network`."""
    return f"{ALIAS_PREFIX}{network}"


def owner_of(link: Link) -> str | None:
    """The network gpuop made `link` for; None for a link gpuop does not own."""
    if link.alias is None or not link.alias.startswith(ALIAS_PREFIX):
        return None
    return link.alias.removeprefix(ALIAS_PREFIX) or None


def owned_links(snapshot: Snapshot) -> dict[str, Link]:
    """gpuop's links, by the network they belong to."""
    found: dict[str, Link] = {}
    for link in snapshot.links:
        network = owner_of(link)
        if network is not None:
            found.setdefault(network, link)
    return found


def devices(snapshot: Snapshot, facts: Mapping[str, NetDevice]) -> dict[str, NetDevice]:
    """Every link as a `NetDevice`: its PCI facts from `facts` (sysfs, by name), what it is
    stacked on from netlink (which, unlike sysfs, sees the namespace the links are in)."""
    below: dict[str, set[str]] = {link.name: set() for link in snapshot.links}
    for link in snapshot.links:
        lower = snapshot.at(link.lower)
        if link.kind in STACKED_KINDS and lower is not None:
            below[link.name].add(lower.name)
        master = snapshot.at(link.master)
        if master is not None:
            below[master.name].add(link.name)
    return {
        link.name: dataclasses.replace(
            facts.get(link.name) or NetDevice(link.name), lower=tuple(sorted(below[link.name]))
        )
        for link in snapshot.links
    }


def default_route_names(snapshot: Snapshot) -> frozenset[str]:
    return frozenset(
        link.name for index in snapshot.default_routes if (link := snapshot.at(index)) is not None
    )


def management_links(snapshot: Snapshot, devices: Mapping[str, NetDevice]) -> frozenset[str]:
    """The links that carry the node's management traffic (see the module docstring)."""
    return netdevs.beneath(devices, default_route_names(snapshot))


def ofed_reload_cuts_off(snapshot: Snapshot, devices: Mapping[str, NetDevice]) -> tuple[str, ...]:
    """The default-route interfaces an OFED reload would reset on this node."""
    return netdevs.management_interfaces(devices, default_route_names(snapshot), OFED_DRIVERS)


@dataclass(frozen=True)
class Refusal:
    """Why a network cannot be set up on this node."""

    reason: NetworkFailureReason
    message: str


def choose_master(
    network: SecondaryNetwork,
    snapshot: Snapshot,
    devices: Mapping[str, NetDevice],
    protected: frozenset[str],
    *,
    allow_management: bool,
) -> Link | Refusal:
    """The NIC `network` stacks on: the one its master names, or the first by name of
    those its selectors match; a `Refusal` when there is none it may use."""
    master = network.master
    if master.interface is not None:
        link = snapshot.named(master.interface)
        if link is None or owner_of(link) is not None:
            return Refusal(
                NetworkFailureReason.NO_MATCHING_NIC,
                f"master {master.interface} of network {network.name}: no such interface",
            )
        if link.name in protected and not allow_management:
            return Refusal(
                NetworkFailureReason.MANAGEMENT_INTERFACE,
                f"master {link.name} of network {network.name} carries the node's default "
                "route; gpuop leaves it alone unless allowManagementNicReconfigure is set",
            )
        return link
    matching = [
        link
        for link in snapshot.links
        if owner_of(link) is None
        and (device := devices.get(link.name)) is not None
        and device.pci_address is not None
        and master.matches(device.vendor_id, device.device_id, device.driver)
    ]
    usable = [link for link in matching if allow_management or link.name not in protected]
    if usable:
        return min(usable, key=lambda link: link.name)
    wanted = _describe(master.vendors, master.device_ids, master.drivers)
    if matching:
        return Refusal(
            NetworkFailureReason.MANAGEMENT_INTERFACE,
            f"network {network.name}: the only NICs with {wanted} "
            f"({', '.join(link.name for link in matching)}) carry the node's default route; "
            "gpuop leaves them alone unless allowManagementNicReconfigure is set",
        )
    return Refusal(
        NetworkFailureReason.NO_MATCHING_NIC,
        f"network {network.name}: no NIC with {wanted}",
    )


def must_recreate(link: Link, network: SecondaryNetwork, master: Link) -> bool:
    """Whether gpuop's existing `link` for `network` cannot be changed in place into what
    the network asks for: another type, mode or NIC needs a new link."""
    return link.kind != network.type or link.mode != network.link_mode or link.lower != master.index


def _describe(vendors: Iterable[str], device_ids: Iterable[str], drivers: Iterable[str]) -> str:
    parts = [
        f"{what} {' or '.join(values)}"
        for what, values in (
            ("vendor", list(vendors)),
            ("device id", list(device_ids)),
            ("driver", list(drivers)),
        )
        if values
    ]
    return " and ".join(parts)
