"""Addresses for the nodes' links, claimed in the `gpuop_ipam` KV bucket so that no two nodes
ever hold one address, even when they claim at the same moment, and no node can take or free
another node's address.

Two kinds of keys, each written only by the node it names (`gpuop.bus.grants`):

    claim.<node>.<subnet>.<address>  the node's claim of one address
    node.<node>.<network>            the node's record of the address it holds on a network,
                                     so a restarted agent finds its own claims

Of the live claims of one address (`claim.*.<subnet>.<address>`) the one with the lowest
revision (its stream sequence, which the server gives) holds it. A node creates its claim,
then lists the address's claims: every claim written before its own is in that listing, so
it either holds the address or sees the earlier claim, deletes its own and moves on to the
next candidate. Of two nodes racing exactly one wins; a claim that is deleted (a delete or
purge marker) no longer counts, and the next earliest holds the address. A node never
rewrites a claim it holds (a new revision would put it behind later claims). Any node may
claim a free address, but none can write, delete or outrank another node's claim.

`<node>` is the node's subject token (`gpu-1_example_com`), `<subnet>` the pool's subnet with
`_` for `/` (`10.10.0.0_24`): networks sharing a subnet share its addresses. `<address>` is
the address (IPv6 written out in full, `-` for `:`). The node comes first because an IPv4
subnet or address spans several tokens: a permission binds to a token at a fixed place, and
the node's grants name exactly the two shapes that follow it (`gpuop.bus.grants.CLAIM_SHAPES`).

Claims made before the node's name was in the key (`addr.<subnet>.<address>`, created if
absent, so exclusive; under a prefix of their own, so that no node's claim grant ever
reaches one) are honoured as held by the node their value names, ahead of every
newer claim; that node keeps using it and adds a claim of its own next to it, and a
malformed one holds its address for nobody. No node may write or delete them any more: an
administrator deletes them (`nats kv del gpuop_ipam addr.<subnet>.<address>`) once every
agent has started with this version (its new claim then holds the address).

A node walks its pool's candidates from a starting point derived from its name, skipping
addresses already held, so nodes rarely race and a restarted node walks the same way: a
claim it made just before a crash (its record not yet written) is found again and kept, or
withdrawn if it lost. `applying.NodeNetworks` claims before it touches a link and gives the
address back when configuring the link fails, so an exhausted pool or a refused link leaves
nothing behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuop.bus import KeyExists, KeyValue, KvEntry, RevisionConflict
from gpuop.events import subjects
from gpuop.policy import IpamPool, SecondaryNetwork
from gpuop.services.network_manager import blocks
from gpuop.services.network_manager.blocks import (
    Block,
    SubnetBlocks,
    address_token,
    live_entries,
    pool_token,
)
from gpuop.services.network_manager.netlink import Interface

log = logging.getLogger(__name__)

CLAIMS = "claim"
LEGACY_CLAIMS = "addr"
"""Claims made before the node was in the key: read, never written."""
RECORDS = "node"


class PoolExhausted(Exception):
    """Every address of the pool is held by another node."""

    def __init__(self, network: str, pool: IpamPool) -> None:
        super().__init__(
            f"pool {pool.cidr} of network {network} has no free address: all "
            f"{pool.size} in {pool.first}-{pool.last} are excluded or held by other nodes"
        )
        self.network = network


class BlockExhausted(PoolExhausted):
    """Every address of this node's block is held by another node or excluded."""

    def __init__(self, network: str, pool: IpamPool, node: str, block: Block) -> None:
        Exception.__init__(
            self,
            f"block {block} of pool {pool.cidr} (network {network}) given to node {node} has "
            "no free address: each is excluded or held by a claim made before the pool had "
            "blocks; raise perNodeBlockSize",
        )
        self.network = network


class BlockPending(Exception):
    """The pool has per-node blocks and this node has none yet: it claims nothing until
    network-manager's cluster role gives it one."""

    def __init__(self, network: str, pool: IpamPool, node: str) -> None:
        super().__init__(
            f"pool {pool.cidr} of network {network} is cut into per-node blocks and node "
            f"{node} has none yet: waiting for network-manager's cluster role to give it one"
        )
        self.network = network


class ClaimValue(BaseModel):
    """What a claim and a node's record say."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    node: str
    network: str
    address: str
    """With its prefix length: `10.10.0.5/24`."""


def claim_key(address: Interface, node: str) -> str:
    """The key of `node`'s claim of `address` in its subnet."""
    return f"{CLAIMS}.{subjects.encode_node(node)}.{_address_part(address)}"


def legacy_claim_key(address: Interface) -> str:
    """The key of a claim made before claims named their node (read, never written)."""
    return f"{LEGACY_CLAIMS}.{_address_part(address)}"


def claims_filter(address: Interface) -> str:
    """Every node's claim of `address`."""
    return f"{CLAIMS}.*.{_address_part(address)}"


def _address_part(address: Interface) -> str:
    return f"{pool_token(address.network)}.{address_token(address.ip)}"


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds an address: a node token (None: a malformed old claim, held by nobody
    known) and the network its claim is for (None: a claim that does not say)."""

    token: str | None
    network: str | None


@dataclass(frozen=True, slots=True)
class Holding:
    """The live claims of one address."""

    claims: tuple[tuple[str, KvEntry, ClaimValue | None], ...]
    """(node token, entry, value) of every live claim, earliest first."""
    counting: frozenset[int] = frozenset()
    """The revisions of the claims that count (`blocks.SubnetBlocks.counts`)."""
    legacy: bool = False
    """Whether an old claim (`addr.<subnet>.<address>`) holds the address."""
    legacy_value: ClaimValue | None = None
    """What the old claim says (None: malformed)."""

    @property
    def holder(self) -> Holder | None:
        """The holder: the old claim's node, else the earliest claim's; None when free."""
        if self.legacy:
            value = self.legacy_value
            if value is None:
                return Holder(None, None)
            return Holder(subjects.encode_node(value.node), value.network)
        for token, entry, value in self.claims:
            if entry.revision in self.counting:
                return Holder(token, None if value is None else value.network)
        return None

    def claim_of(self, token: str) -> tuple[KvEntry, ClaimValue | None] | None:
        for owner, entry, value in self.claims:
            if owner == token:
                return entry, value
        return None


class Addresses:
    """One node's claims in the `gpuop_ipam` bucket."""

    def __init__(self, kv: KeyValue, node: str) -> None:
        self._kv = kv
        self._node = node
        self._token = subjects.encode_node(node)

    def record_key(self, network: str) -> str:
        return f"{RECORDS}.{self._token}.{network}"

    async def recorded(self, network: str) -> Interface | None:
        """The address this node's record says it holds on `network`."""
        entry = await self._kv.get(self.record_key(network))
        return None if entry is None else self._address_of(entry)

    async def records(self) -> dict[str, Interface]:
        """Every network this node holds an address on, with the address."""
        found: dict[str, Interface] = {}
        for entry in await self._entries(f"{RECORDS}.{self._token}.>"):
            address = self._address_of(entry)
            if address is not None:
                found[entry.key.rpartition(".")[2]] = address
        return found

    async def confirm(self, network: SecondaryNetwork, address: Interface) -> bool:
        """Whether this node still holds `address` in the network's current pool: it must
        be assignable there, and this node's claim for the network must hold it (a claim
        that vanished is made again, if no other node holds the address meanwhile)."""
        pool = network.ipam
        if address.network != pool.network or not pool.assignable(address.ip):
            return False
        holding = await self._holding(address)
        holder = holding.holder
        if holder is None:
            return await self._take(address, network.name)
        if holder == Holder(self._token, network.name):
            if holding.legacy and holding.claim_of(self._token) is None:
                await self._adopt(address, network.name)
            return True
        await self._withdraw(holding)
        return False

    async def claim(self, network: SecondaryNetwork) -> Interface:
        """Claim a free address of the network's pool, inside this node's block when the
        pool has blocks; `PoolExhausted` when none is left, `BlockPending` while the node
        has no block."""
        pool = network.ipam
        cut = await blocks.read(self._kv, pool.network)
        held = await self._pool(pool.network, cut)
        for lost in held.values():  # claims it lost, left by a crash
            await self._withdraw(lost)
        block: Block | None = None
        if pool.per_node_block_size is not None or cut.epoch is not None:
            block = cut.of(self._token)
            if block is None:
                raise BlockPending(network.name, pool, self._node)
        for candidate in self._walk(pool, block):
            address = ipaddress.ip_interface(f"{candidate}/{pool.network.prefixlen}")
            holding = held.get(address_token(address.ip))
            if holding is not None and holding.holder is not None:
                if holding.holder == Holder(self._token, network.name):
                    return address  # this node's, from before a crash
                continue
            if await self._take(address, network.name):
                log.info("claimed %s for network %s", address, network.name)
                return address
        if block is not None:
            raise BlockExhausted(network.name, pool, self._node, block)
        raise PoolExhausted(network.name, pool)

    async def record(self, network: str, address: Interface) -> None:
        """Write this node's record of holding `address` on `network` (one writer: this
        node's agent, so a plain put is enough)."""
        value = ClaimValue(node=self._node, network=network, address=str(address))
        await self._kv.put(self.record_key(network), value.model_dump_json().encode())

    async def give_back(self, network: str, address: Interface) -> None:
        """Delete this node's claim of `address` for `network`, if it has one."""
        holding = await self._holding(address)
        found = holding.claim_of(self._token)
        if found is not None:
            entry, value = found
            if value is not None and value.network != network:
                return  # this node's claim for another network sharing the subnet
            with contextlib.suppress(RevisionConflict):  # changed meanwhile: keep it
                await self._kv.delete(entry.key, revision=entry.revision)
            log.info("released %s of network %s", address, network)
        if holding.legacy and holding.holder == Holder(self._token, network):
            log.warning(
                "%s of network %s stays held by its old claim %s, which no node may delete: "
                "delete it as an administrator",
                address,
                network,
                legacy_claim_key(address),
            )

    async def release(self, network: str) -> Interface | None:
        """Give back what this node holds on `network` and forget its record; the address
        released, if it held one."""
        address = await self.recorded(network)
        if address is not None:
            await self.give_back(network, address)
        await self._kv.delete(self.record_key(network))
        return address

    def _walk(self, pool: IpamPool, block: Block | None = None) -> Iterator[blocks.Address]:
        """The pool's candidates (the block's, when it has one) from this node's start."""
        digest = hashlib.sha256(self._node.encode()).digest()
        start = int.from_bytes(digest[:8], "big")
        if block is None:
            return pool.candidates(start=start % pool.size)
        return _block_candidates(pool, block, start)

    async def _take(self, address: Interface, network: str) -> bool:
        """Claim `address` and keep the claim if it is the earliest; withdraw it if not."""
        value = ClaimValue(node=self._node, network=network, address=str(address))
        with contextlib.suppress(KeyExists):  # this node's claim from before a crash
            await self._kv.create(claim_key(address, self._node), value.model_dump_json().encode())
        holding = await self._holding(address)
        if holding.holder == Holder(self._token, network):
            return True
        await self._withdraw(holding)
        return False

    async def _adopt(self, address: Interface, network: str) -> None:
        """Add this node's claim next to its old one, which an administrator may then
        delete."""
        value = ClaimValue(node=self._node, network=network, address=str(address))
        with contextlib.suppress(KeyExists):
            await self._kv.create(claim_key(address, self._node), value.model_dump_json().encode())
        log.info("claimed %s of network %s next to its old claim", address, network)

    async def _withdraw(self, holding: Holding) -> None:
        """Delete this node's claim of an address it does not hold (it lost the race, or
        made it before a crash); one that holds the address for another network stays."""
        found = holding.claim_of(self._token)
        holder = holding.holder
        if found is None or (holder is not None and holder.token == self._token):
            return
        entry, _ = found
        with contextlib.suppress(RevisionConflict):
            await self._kv.delete(entry.key, revision=entry.revision)
        log.info("withdrew %s: %s holds the address", entry.key, holder and holder.token)

    async def _holding(self, address: Interface) -> Holding:
        """The live claims of `address`, as they are now."""
        cut = await blocks.read(self._kv, address.network)
        claims = await self._entries(claims_filter(address))
        legacy = await self._kv.get(legacy_claim_key(address))
        found = [(entry.key.split(".", 2)[1], entry) for entry in claims]
        return self._holding_of(address.ip, found, legacy, cut)

    async def _pool(
        self, subnet: ipaddress.IPv4Network | ipaddress.IPv6Network, cut: SubnetBlocks
    ) -> dict[str, Holding]:
        """The claims of every address of `subnet`, by address token."""
        pool = pool_token(subnet)
        claims: dict[str, list[tuple[str, KvEntry]]] = {}
        for entry in await self._entries(f"{CLAIMS}.*.{pool}.>"):
            _, token, rest = entry.key.split(".", 2)
            claims.setdefault(rest.removeprefix(f"{pool}."), []).append((token, entry))
        legacy = {
            entry.key.removeprefix(f"{LEGACY_CLAIMS}.{pool}."): entry
            for entry in await self._entries(f"{LEGACY_CLAIMS}.{pool}.>")
        }
        found: dict[str, Holding] = {}
        for token in claims.keys() | legacy.keys():
            address = _address_of_token(token)
            if address is not None:
                found[token] = self._holding_of(
                    address, claims.get(token, []), legacy.get(token), cut
                )
        return found

    def _holding_of(
        self,
        address: blocks.Address,
        claims: list[tuple[str, KvEntry]],
        legacy: KvEntry | None,
        cut: SubnetBlocks,
    ) -> Holding:
        ordered = sorted(claims, key=lambda claim: claim[1].revision)
        return Holding(
            tuple((token, entry, self._value_of(entry)) for token, entry in ordered),
            frozenset(
                entry.revision
                for token, entry in ordered
                if cut.counts(token, entry.revision, address)
            ),
            legacy is not None,
            None if legacy is None else self._value_of(legacy),
        )

    def _address_of(self, entry: KvEntry) -> Interface | None:
        value = self._value_of(entry)
        if value is None:
            return None
        try:
            return ipaddress.ip_interface(value.address)
        except ValueError:
            log.warning("ignoring %s: %r is no address", entry.key, value.address)
            return None

    def _value_of(self, entry: KvEntry) -> ClaimValue | None:
        try:
            return ClaimValue.model_validate_json(entry.value)
        except ValidationError as error:
            log.warning("ignoring the malformed IPAM entry %s: %s", entry.key, error)
            return None

    async def _entries(self, pattern: str) -> list[KvEntry]:
        return await live_entries(self._kv, pattern)


def _block_candidates(pool: IpamPool, block: Block, start: int) -> Iterator[blocks.Address]:
    first, size = int(block.first), int(block.last) - int(block.first) + 1
    kind = type(block.first)
    for step in range(size):
        address = kind(first + (start + step) % size)
        if address in pool.network and pool.assignable(address):
            yield address


def _address_of_token(token: str) -> blocks.Address | None:
    try:
        return ipaddress.ip_address(token.replace("-", ":"))
    except ValueError:
        return None
