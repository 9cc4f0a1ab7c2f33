"""Secondary networks and RDMA devices on a node: the order to apply the policy, and what
came of it.

The network policy (which NICs, which macvlan/ipvlan networks, MTUs, IPAM pools) lives in the
`gpuop_config` KV bucket under the key `network`, where network-manager's cluster role puts
it. Node network-managers watch it; `ApplyNetwork` (`gpuop.cmd.network-manager.<node>.apply`)
asks one node to converge to a given policy revision now, for example after an OFED reload
recreated its interfaces.

The node's network-manager publishes `NetworkConfigured` for each network it set up,
`NetworkFailed` for each it could not and `NetworkRemoved` for each it took down, whenever
the outcome changes (and again in answer to `ApplyNetwork`), plus `RdmaDevicesDiscovered`
when the node's RDMA devices change. The upgrade orchestrator uses them to validate a node
after an OFED upgrade, and to see before one which node's management NIC an OFED reload
would reset.
"""

from __future__ import annotations

from ipaddress import IPv4Interface, IPv6Interface
from typing import Annotated, ClassVar

from pydantic import Field, StringConstraints

from gpuop.events.envelope import Command, Event
from gpuop.events.fields import DocumentedEnum, Message, ModuleName, ObjectName, Record, Sha256
from gpuop.events.hardware import PciAddress

InterfaceName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]{1,15}$")]
"""A Linux network interface name (at most 15 characters, IFNAMSIZ - 1)."""
PolicyRevision = Annotated[int, Field(ge=0, le=2**53)]
"""Revision of the network policy's entry in the `gpuop_config` KV bucket."""


class LinkMode(DocumentedEnum):
    """How a secondary network's interface is stacked on its NIC."""

    MACVLAN = "macvlan"
    """A macvlan link with its own MAC address."""
    IPVLAN = "ipvlan"
    """An ipvlan link sharing the NIC's MAC address."""


class NetworkFailureReason(DocumentedEnum):
    """Why a network could not be configured."""

    NO_MATCHING_NIC = "no-matching-nic"
    """No NIC on the node has the network's master name or matches its selectors."""
    MANAGEMENT_INTERFACE = "management-interface"
    """The NIC it needs carries the default route, and the policy keeps gpuop off it."""
    ADDRESSES_EXHAUSTED = "addresses-exhausted"
    """The IPAM pool has no free address left."""
    NETLINK_ERROR = "netlink-error"
    """The kernel refused a link, address or MTU change."""
    CONFLICT = "conflict"
    """An interface of that name exists and gpuop does not own it."""
    OTHER = "other"
    """Anything else; see the message."""


class NetworkConfigured(Event):
    """A secondary network is set up on the node as the policy says."""

    DOMAIN: ClassVar[str] = "network"
    NAME: ClassVar[str] = "configured"

    network: ObjectName
    """Name of the network in the policy (and of its NetworkAttachmentDefinition)."""
    interface: InterfaceName
    """The link gpuop created for it."""
    master: InterfaceName
    """The NIC it is stacked on."""
    mode: LinkMode
    """Link type."""
    mtu: Annotated[int, Field(ge=68, le=65535)]
    """MTU of the link."""
    addresses: tuple[IPv4Interface | IPv6Interface, ...] = Field(default=(), max_length=16)
    """Addresses claimed from the IPAM pool, with prefix length: `10.10.0.5/24`."""
    policy_revision: PolicyRevision
    """Policy revision this configuration implements."""


class NetworkFailed(Event):
    """A secondary network could not be set up on the node."""

    DOMAIN: ClassVar[str] = "network"
    NAME: ClassVar[str] = "failed"

    network: ObjectName
    """Name of the network in the policy."""
    reason: NetworkFailureReason
    """Why it failed."""
    message: Message = ""
    """Detail for operators."""
    policy_revision: PolicyRevision
    """Policy revision that was being applied."""


class NetworkRemoved(Event):
    """A secondary network the policy no longer has is gone from the node: its link was
    deleted and its addresses were given back to the pool."""

    DOMAIN: ClassVar[str] = "network"
    NAME: ClassVar[str] = "removed"

    network: ObjectName
    """Name of the network that was removed."""
    interface: InterfaceName | None = None
    """The link that was deleted; absent when the node held only an address."""
    addresses: tuple[IPv4Interface | IPv6Interface, ...] = Field(default=(), max_length=16)
    """Addresses given back to the IPAM pool."""
    policy_revision: PolicyRevision
    """Policy revision without the network."""


class RdmaPortState(DocumentedEnum):
    """Logical state of an RDMA port, as `ports/<n>/state` in sysfs says it."""

    DOWN = "down"
    """No link."""
    INIT = "init"
    """Link up, not yet configured by the subnet manager (InfiniBand)."""
    ARMED = "armed"
    """Configured, not yet active (InfiniBand)."""
    ACTIVE = "active"
    """Ready for traffic."""
    ACTIVE_DEFER = "active-defer"
    """Active, holding traffic back for a moment."""
    UNKNOWN = "unknown"
    """sysfs said something else, or nothing."""


class RdmaLinkLayer(DocumentedEnum):
    """What an RDMA port runs over."""

    ETHERNET = "ethernet"
    """RoCE: RDMA over Converged Ethernet."""
    INFINIBAND = "infiniband"
    """Native InfiniBand."""
    UNKNOWN = "unknown"
    """sysfs did not say."""


class RdmaPort(Record):
    """One port of an RDMA device."""

    number: Annotated[int, Field(ge=1, le=255)]
    """Port number, from 1."""
    state: RdmaPortState
    """Logical port state."""
    link_layer: RdmaLinkLayer
    """Ethernet (RoCE) or InfiniBand."""
    netdev: InterfaceName | None = None
    """The network interface of the port (`enp65s0f0np0`); absent when it has none."""
    rate: Annotated[str, StringConstraints(max_length=64)] | None = None
    """Link rate as sysfs gives it: `400 Gb/sec (4X NDR)`."""


class RdmaDevice(Record):
    """One RDMA device (an HCA function) of the node, from `/sys/class/infiniband`."""

    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    """Device name: `mlx5_0`."""
    pci_address: PciAddress | None = None
    """The PCI function behind it; absent for a software device."""
    driver: ModuleName | None = None
    """Kernel driver of that PCI function: `mlx5_core`."""
    ports: tuple[RdmaPort, ...] = Field(default=(), max_length=16)
    """The device's ports, by number."""


class RdmaDevicesDiscovered(Event):
    """The node's RDMA devices, published when they (or their ports) change."""

    DOMAIN: ClassVar[str] = "network"
    NAME: ClassVar[str] = "rdma-discovered"

    devices: tuple[RdmaDevice, ...] = Field(default=(), max_length=256)
    """Every RDMA device, by name."""
    management_interfaces: tuple[InterfaceName, ...] = Field(default=(), max_length=16)
    """Interfaces that carry the node's default route and sit on a PCI function bound to an
    OFED module (`mlx5_core`, ...): reloading OFED on this node would reset them."""


class ApplyNetwork(Command):
    """Converge the node's secondary networks to (at least) the given policy revision."""

    SERVICE: ClassVar[str] = "network-manager"
    VERB: ClassVar[str] = "apply"

    policy_revision: PolicyRevision
    """KV revision of the policy to apply; the agent reads it from `gpuop_config`."""
    policy_hash: Sha256
    """SHA-256 of the policy document, so the agent can tell it read the right one."""
