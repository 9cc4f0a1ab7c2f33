"""Secondary networks on a node: the order to apply the policy, and what came of it.

The network policy (which NICs, which macvlan/ipvlan networks, MTUs, IPAM pools) lives in the
`gpuop_config` KV bucket. Node network-managers watch it; `ApplyNetwork`
(`gpuop.cmd.network-manager.<node>.apply`) asks one node to converge to a given policy revision
now, for example after an OFED reload recreated its interfaces.

The node's network-manager publishes `NetworkConfigured` for each network it set up and
`NetworkFailed` for each it could not. Network-manager's cluster role consumes them to write
Multus NetworkAttachmentDefinitions; the upgrade orchestrator uses them to validate a node
after an OFED upgrade.
"""

from __future__ import annotations

from ipaddress import IPv4Interface, IPv6Interface
from typing import Annotated, ClassVar

from pydantic import Field, StringConstraints

from gpuop.events.envelope import Command, Event
from gpuop.events.fields import DocumentedEnum, Message, ObjectName, Sha256

InterfaceName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]{1,15}$")]
"""A Linux network interface name (at most 15 characters, IFNAMSIZ - 1)."""
PolicyRevision = Annotated[int, Field(ge=0, le=2**53)]
"""Revision of the network policy's entry in the `gpuop_config` KV bucket."""


class LinkMode(DocumentedEnum):
    """How a secondary network's interface is stacked on its NIC."""

    MACVLAN = "macvlan"
    """A macvlan link (bridge mode) with its own MAC address."""
    IPVLAN = "ipvlan"
    """An ipvlan link (L2 mode) sharing the NIC's MAC address."""


class NetworkFailureReason(DocumentedEnum):
    """Why a network could not be configured."""

    NO_MATCHING_NIC = "no-matching-nic"
    """No NIC on the node matches the network's selector."""
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


class ApplyNetwork(Command):
    """Converge the node's secondary networks to (at least) the given policy revision."""

    SERVICE: ClassVar[str] = "network-manager"
    VERB: ClassVar[str] = "apply"

    policy_revision: PolicyRevision
    """KV revision of the policy to apply; the agent reads it from `gpuop_config`."""
    policy_hash: Sha256
    """SHA-256 of the policy document, so the agent can tell it read the right one."""
