"""The `ipam` of a secondary network: the address pool its node links are numbered from.

A pool is a subnet (`cidr`), the part of it gpuop hands to nodes (`rangeStart` to
`rangeEnd`, by default the whole subnet), a `gateway` and `exclude`d addresses or blocks.
Network-manager's node role claims one address per node and network from it in the
`gpuop_ipam` KV bucket, walking `candidates` from a starting point of its own; its cluster
role gives pods the rest of the subnet through the NetworkAttachmentDefinition
(`pod_exclusions`).

Everything an address needs is checked when the policy is read, so a node never finds out
in the middle of a rollout that its pool is malformed: every address must lie in the subnet,
the range must run forwards, and it may hold at most `MAX_POOL_SIZE` addresses so that an
exhausted pool is found by a bounded walk.

`perNodeBlockSize` (nv-ipam's name) splits the range into blocks of that many addresses,
counted from `rangeStart`; network-manager's cluster role gives each node one block and a
node's claims count only inside its block (`gpuop.services.network_manager.blocks`), so no
node can take the whole pool. The block size must fit the range at least once.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Annotated

from pydantic import AfterValidator, Field, model_validator
from pydantic_core import PydanticCustomError

from gpuop.policy.fields import Section

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network

MAX_POOL_SIZE = 65536
"""The most addresses one pool's range may hold."""


def parse_network(text: str) -> Network:
    """`text` as a subnet in CIDR notation; `ValueError` when it is not one."""
    if "/" not in text:
        raise ValueError(f"{text!r} has no prefix length")
    return ipaddress.ip_network(text, strict=True)


def parse_block(text: str) -> Network:
    """`text` as a subnet, or as one address (a block of one)."""
    return ipaddress.ip_network(text, strict=True)


def _check_cidr(text: str) -> str:
    try:
        parse_network(text)
    except ValueError:
        raise PydanticCustomError(
            "network_cidr",
            'must be a subnet in CIDR notation with the host bits zero, such as "192.168.100.0/24"',
        ) from None
    return text


def _check_address(text: str) -> str:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise PydanticCustomError(
            "network_address", 'must be an IPv4 or IPv6 address, such as "192.168.100.1"'
        ) from None
    return text


def _check_block(text: str) -> str:
    try:
        parse_block(text)
    except ValueError:
        raise PydanticCustomError(
            "network_block",
            'must be an address or a subnet in CIDR notation, such as "192.168.100.64/28"',
        ) from None
    return text


Cidr = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_check_cidr)]
"""A subnet: `192.168.100.0/24`, `fd00:10::/64`."""
IpAddress = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_check_address)]
"""One address: `192.168.100.1`."""
Block = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_check_block)]
"""An address or a subnet: `192.168.100.7`, `192.168.100.64/28`."""


class IpamPool(Section):
    """Where a secondary network's addresses come from."""

    cidr: Cidr
    """The network's subnet, in CIDR notation: `192.168.100.0/24`. Every node link gets
    an address in it with this prefix length."""
    range_start: IpAddress | None = None
    """The first address gpuop may give a node; unset: the subnet's first host address.
    Pods on the network get addresses outside the range, so leave room for them."""
    range_end: IpAddress | None = None
    """The last address gpuop may give a node; unset: the subnet's last host address (and
    no address is left for pods). The range holds at most 65536 addresses."""
    gateway: IpAddress | None = None
    """The subnet's gateway; never given to a node, and handed to pods' IPAM."""
    exclude: list[Block] = Field(default=[], max_length=64)
    """Addresses and subnets that are never given out: `192.168.100.7`,
    `192.168.100.64/28`."""
    per_node_block_size: int | None = Field(default=None, ge=1, le=MAX_POOL_SIZE)
    """How many addresses of the range each node gets as its own block (nv-ipam's
    `perNodeBlockSize`); a node's address comes from its block only, so one node cannot
    claim the whole pool. Unset: any node may claim any free address of the range. Set it
    on every pool of a cluster with per-node NATS identities."""

    @model_validator(mode="after")
    def _consistent(self) -> IpamPool:
        network = self.network
        for name, text in (("rangeStart", self.range_start), ("rangeEnd", self.range_end)):
            if text is not None:
                _require_inside(network, ipaddress.ip_address(text), name)
        if self.gateway is not None:
            _require_inside(network, ipaddress.ip_address(self.gateway), "gateway")
        for index, text in enumerate(self.exclude):
            if not _block_inside(network, parse_block(text)):
                raise PydanticCustomError(
                    "network_outside",
                    "{block} is not inside {cidr}",
                    {"field": f"exclude[{index}]", "block": text, "cidr": self.cidr},
                )
        if int(self.first) > int(self.last):
            raise PydanticCustomError(
                "network_range",
                "must not come after rangeEnd ({end})",
                {"field": "rangeStart", "end": str(self.last)},
            )
        if self.size > MAX_POOL_SIZE:
            raise PydanticCustomError(
                "network_pool_size",
                "the range holds {size} addresses, at most {limit} are allowed: set "
                "rangeStart and rangeEnd",
                {"field": "cidr", "size": self.size, "limit": MAX_POOL_SIZE},
            )
        self._check_block_size()
        if not any(True for _ in self.candidates()):
            raise PydanticCustomError(
                "network_pool_empty",
                "leaves no address to give a node once the gateway and exclusions are taken out",
                {"field": "cidr"},
            )
        return self

    def _check_block_size(self) -> None:
        block = self.per_node_block_size
        if block is not None and block > self.size:
            raise PydanticCustomError(
                "network_block_size",
                "the pool {cidr} has {size} addresses in {first}-{last}, fewer than one "
                "block of {block}",
                {
                    "field": "perNodeBlockSize",
                    "cidr": self.cidr,
                    "size": self.size,
                    "first": str(self.first),
                    "last": str(self.last),
                    "block": block,
                },
            )

    @property
    def network(self) -> Network:
        return parse_network(self.cidr)

    @property
    def block_count(self) -> int:
        """How many whole blocks the range holds (0 without a block size)."""
        if self.per_node_block_size is None:
            return 0
        return self.size // self.per_node_block_size

    def block(self, index: int) -> tuple[Address, Address]:
        """The first and last address of block `index` (from 0)."""
        size = self.per_node_block_size
        if size is None or not 0 <= index < self.block_count:
            raise ValueError(f"pool {self.cidr} has no block {index}")
        kind = type(self.first)
        start = int(self.first) + index * size
        return kind(start), kind(start + size - 1)

    @property
    def first(self) -> Address:
        """The range's first address."""
        if self.range_start is not None:
            return ipaddress.ip_address(self.range_start)
        hosts = _host_bounds(self.network)
        return hosts[0]

    @property
    def last(self) -> Address:
        """The range's last address."""
        if self.range_end is not None:
            return ipaddress.ip_address(self.range_end)
        hosts = _host_bounds(self.network)
        return hosts[1]

    @property
    def size(self) -> int:
        """How many addresses the range spans (assignable or not)."""
        return int(self.last) - int(self.first) + 1

    def assignable(self, address: Address) -> bool:
        """Whether a node may be given `address`: in the range, not the gateway, not
        excluded, and not the subnet's network or broadcast address."""
        return _Screen(self).admits(address)

    def candidates(self, start: int = 0) -> Iterator[Address]:
        """Every assignable address once, beginning `start` addresses into the range and
        wrapping around, so that nodes starting at different points rarely race."""
        screen = _Screen(self)
        first, size = int(self.first), self.size
        kind = type(self.first)
        for step in range(size):
            address = kind(first + (start + step) % size)
            if screen.admits(address):
                yield address

    def pod_exclusions(self) -> list[str]:
        """What pods must not be given, as CIDR blocks for their IPAM's `exclude` list: the
        node range, the gateway and the exclusions."""
        blocks = list(_summarize(self.first, self.last))
        if self.gateway is not None:
            blocks.append(ipaddress.ip_network(self.gateway))
        blocks.extend(parse_block(block) for block in self.exclude)
        return [str(block) for block in ipaddress.collapse_addresses(blocks)]  # type: ignore[type-var]


class _Screen:
    """A pool's rules for one address, parsed once for a walk over many."""

    def __init__(self, pool: IpamPool) -> None:
        low, high = _host_bounds(pool.network)
        self._version = pool.network.version
        self._low = max(int(pool.first), int(low))
        self._high = min(int(pool.last), int(high))
        self._gateway = ipaddress.ip_address(pool.gateway) if pool.gateway else None
        self._excluded = [parse_block(block) for block in pool.exclude]

    def admits(self, address: Address) -> bool:
        if address.version != self._version or not self._low <= int(address) <= self._high:
            return False
        if address == self._gateway:
            return False
        return not any(address in block for block in self._excluded)


def _summarize(first: Address, last: Address) -> Iterator[Network]:
    if isinstance(first, IPv4Address) and isinstance(last, IPv4Address):
        return ipaddress.summarize_address_range(first, last)
    if isinstance(first, IPv6Address) and isinstance(last, IPv6Address):
        return ipaddress.summarize_address_range(first, last)
    raise ValueError(f"{first} and {last} are not of one IP version")


def _host_bounds(network: Network) -> tuple[Address, Address]:
    """The first and last address a host in `network` may have (all of a /31 or /32)."""
    if network.num_addresses <= 2:
        return network[0], network[-1]
    if isinstance(network, IPv4Network):
        return network[1], network[-2]
    return network[1], network[-1]  # IPv6 has no broadcast address


def _require_inside(network: Network, address: Address, field: str) -> None:
    if address.version != network.version or address not in network:
        raise PydanticCustomError(
            "network_outside",
            "{address} is not inside {cidr}",
            {"field": field, "address": str(address), "cidr": str(network)},
        )


def _block_inside(network: Network, block: Network) -> bool:
    if isinstance(network, IPv4Network) and isinstance(block, IPv4Network):
        return block.subnet_of(network)
    if isinstance(network, IPv6Network) and isinstance(block, IPv6Network):
        return block.subnet_of(network)
    return False
