"""The `network` section of the cluster policy: secondary networks, RDMA sharing, and how
far gpuop may go with the NIC that carries the node's default route.

Who reads it: network-manager's cluster role takes it from the `GPUClusterPolicy`, writes
one Multus NetworkAttachmentDefinition per network and publishes the section in the
`gpuop_config` KV bucket under `CONFIG_KEY` (`PublishedNetwork`), where the node roles
(which hold no Kubernetes credentials) and the device plugin read it. Each node role
stacks one link per network (`SecondaryNetwork.link_name`) on the NIC its `master` picks
and numbers it from the network's `ipam` pool (`gpuop.policy.pools`). The upgrade
orchestrator reads `allowManagementNicReload` when it reloads the OFED driver.

The management NIC (the one carrying the default route, with the bonds, bridges or VLANs
between) is protected: a network never lands on it and gpuop never changes its MTU or
state, unless `allowManagementNicReconfigure` says so; an OFED reload that would reset it
fails its step unless `allowManagementNicReload` says so.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from gpuop.policy.fields import Section, matching
from gpuop.policy.pools import IpamPool
from gpuop.policy.rdma import InterfaceName, NicSelectors, RdmaSharedDevice

CONFIG_KEY = "network"
"""Key of the published network section in the `gpuop_config` KV bucket."""
LINK_PREFIX = "gpuop-"
"""Start of the default name of a network's link on every node."""
MAX_NETWORKS = 32

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
"""An RFC 1123 label: the network's (and its NetworkAttachmentDefinition's) name."""
RESOURCE_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"

NetworkName = Annotated[
    str,
    Field(max_length=63, json_schema_extra={"pattern": NAME_PATTERN}),
    matching(NAME_PATTERN, 'must be lowercase letters, digits and "-", such as "roce-a"'),
]
"""A network's name, or the namespace of its NetworkAttachmentDefinition."""
LinkType = Literal["macvlan", "ipvlan"]
LinkMode = Literal["bridge", "private", "vepa", "l2", "l3", "l3s"]
MODES: dict[str, tuple[str, ...]] = {
    "macvlan": ("bridge", "private", "vepa"),
    "ipvlan": ("l2", "l3", "l3s"),
}
"""The modes of each link type; the first is the default. macvlan's `passthru` is left out:
it allows one link on the NIC, and pods stack theirs beside gpuop's."""


class Master(NicSelectors):
    """The NIC a network's links are stacked on: by its name, or by what it is. Exactly one
    way must be used. With selectors, the first matching NIC by name is taken, and the
    management NIC never qualifies."""

    interface: InterfaceName | None = None
    """The NIC's name on every node: `enp65s0f0np0`."""

    @model_validator(mode="after")
    def _one_way(self) -> Master:
        if self.interface is None and self.empty:
            raise PydanticCustomError(
                "network_master",
                "name the NIC with interface, or select it with vendors, deviceIDs or drivers",
            )
        if self.interface is not None and not self.empty:
            raise PydanticCustomError(
                "network_master",
                "a NIC named by interface takes no vendors, deviceIDs or drivers",
                {"field": "interface"},
            )
        return self


class SecondaryNetwork(Section):
    """One secondary network: a link on every node's NIC, and an attachment for pods."""

    name: NetworkName
    """The network's name; its NetworkAttachmentDefinition has the same name."""
    namespace: NetworkName = "default"
    """Namespace of the NetworkAttachmentDefinition; pods there join with the annotation
    `k8s.v1.cni.cncf.io/networks: <namespace>/<name>`."""
    type: LinkType = "macvlan"
    """How links are stacked on the NIC: `macvlan` (a MAC address each) or `ipvlan` (the
    NIC's MAC address shared)."""
    mode: LinkMode | None = None
    """macvlan: `bridge` (default), `private` or `vepa`; ipvlan: `l2` (default), `l3` or
    `l3s`."""
    master: Master
    """The NIC the network is stacked on."""
    mtu: int | None = Field(default=None, ge=68, le=65535)
    """MTU of the links; gpuop raises the NIC's MTU to it when lower (never on the
    management NIC). Unset: the NIC's MTU."""
    ipam: IpamPool
    """The pool the nodes' links are numbered from; pods get the rest of the subnet."""
    interface: InterfaceName | None = None
    """Name of the link on every node, which is also the `master` pods' links are stacked
    on. Unset: `gpuop-<name>`, shortened with a hash when longer than 15 characters."""
    resource_name: (
        Annotated[
            str,
            Field(max_length=317, json_schema_extra={"pattern": RESOURCE_PATTERN}),
            matching(RESOURCE_PATTERN, 'must be an extended resource such as "rdma/roce_shared"'),
        ]
        | None
    ) = None
    """A device-plugin resource pods on this network need, such as `rdma/roce_shared`;
    the NetworkAttachmentDefinition names it so that Multus requests it for them."""

    @model_validator(mode="after")
    def _mode_fits_type(self) -> SecondaryNetwork:
        if self.mode is not None and self.mode not in MODES[self.type]:
            raise PydanticCustomError(
                "network_mode",
                "{type} links take one of {modes}",
                {"field": "mode", "type": self.type, "modes": ", ".join(MODES[self.type])},
            )
        if self.mtu is not None and self.mtu < 1280 and self.ipam.network.version == 6:
            raise PydanticCustomError(
                "network_mtu", "must be >= 1280 for an IPv6 subnet", {"field": "mtu"}
            )
        return self

    @property
    def link_mode(self) -> str:
        """The mode the links are created with."""
        return self.mode or MODES[self.type][0]

    @property
    def link_name(self) -> str:
        """Name of the network's link on every node."""
        if self.interface is not None:
            return self.interface
        if len(LINK_PREFIX) + len(self.name) <= 15:
            return LINK_PREFIX + self.name
        digest = hashlib.sha256(self.name.encode()).hexdigest()[:4]
        return f"{LINK_PREFIX}{self.name[:4].rstrip('-')}{digest}"


class NetworkSpec(Section):
    """Secondary networks, RDMA sharing, and what gpuop may do to the management NIC."""

    networks: list[SecondaryNetwork] = Field(
        default=[],
        max_length=MAX_NETWORKS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """The secondary networks every node joins. Removing one removes its links and frees
    its addresses."""
    rdma_shared_devices: list[RdmaSharedDevice] = Field(
        default=[],
        max_length=64,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["resourceName"],
        },
    )
    """The RDMA resources the device plugin advertises."""
    allow_management_nic_reconfigure: bool = False
    """Let a network's master be the NIC carrying the node's default route, and let gpuop
    change that NIC's MTU and bring it up. Off: such a network fails on that node."""
    allow_management_nic_reload: bool = False
    """Let an OFED driver reload go ahead on a node where it resets the NIC carrying the
    default route (the node drops off the network until the driver is back). Off: that
    node's upgrade step fails with the reason."""

    @model_validator(mode="after")
    def _unique(self) -> NetworkSpec:
        for field, what, names in (
            ("networks", "the name", [network.name for network in self.networks]),
            ("networks", "the link name", [network.link_name for network in self.networks]),
            (
                "rdmaSharedDevices",
                "the resource",
                [device.full_name for device in self.rdma_shared_devices],
            ),
        ):
            repeated = sorted(name for name, count in Counter(names).items() if count > 1)
            if repeated:
                raise PydanticCustomError(
                    "network_unique",
                    "{what} {name} is used more than once",
                    {"field": field, "what": what, "name": repeated[0]},
                )
        self._blocks_agree()
        return self

    def _blocks_agree(self) -> None:
        """Networks sharing a subnet share its blocks, so they must cut them alike."""
        cut: dict[str, tuple[str, str, int | None, str]] = {}
        for network in self.networks:
            pool = network.ipam
            mine = (str(pool.first), str(pool.last), pool.per_node_block_size, network.name)
            other = cut.setdefault(str(pool.network), mine)
            blocked = other[2] is not None or mine[2] is not None
            if blocked and other[:3] != mine[:3]:
                raise PydanticCustomError(
                    "network_blocks",
                    "networks {a} and {b} share the subnet {cidr}: they must have the same "
                    "perNodeBlockSize, rangeStart and rangeEnd when either has a block size",
                    {"field": "networks", "a": other[3], "b": network.name, "cidr": pool.cidr},
                )

    def network(self, name: str) -> SecondaryNetwork | None:
        """The network called `name`, if the section has one."""
        return next((network for network in self.networks if network.name == name), None)


class PublishedNetwork(BaseModel):
    """The `gpuop_config` entry under `CONFIG_KEY`: the network section in force, and the
    policy it comes from (none: no policy, so no networks)."""

    model_config = ConfigDict(frozen=True, extra="ignore", use_attribute_docstrings=True)

    policy: str | None = None
    """Name of the GPUClusterPolicy the section was taken from."""
    generation: int | None = None
    """That policy's `metadata.generation`."""
    spec: NetworkSpec = NetworkSpec()
    """The section, as validated."""

    def encode(self) -> bytes:
        """The entry's value: camelCase JSON, as the policy spells it."""
        return self.model_dump_json(by_alias=True).encode()
