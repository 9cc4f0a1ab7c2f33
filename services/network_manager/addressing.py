"""Addresses for the nodes' links, claimed in the `gpuop_ipam` KV bucket so that no two nodes
ever hold one address, even when they claim at the same moment.

Two kinds of keys:

    addr.<subnet>.<address>    the claim of one address: created only if absent, so of two
                               nodes racing for it exactly one wins; the loser moves on
    node.<node>.<network>      the node's record of the address it holds on a network, so a
                               restarted agent finds its own claims

`<subnet>` is the pool's subnet with `_` for `/` (`10.10.0.0_24`): networks sharing a subnet
share its addresses. `<address>` is the address (IPv6 written out in full, `-` for `:`).

A node walks its pool's candidates from a starting point derived from its name, skipping
addresses already claimed, so nodes rarely race and a restarted node walks the same way:
a claim it made just before a crash (its record not yet written) is found again and kept.
`applying.NodeNetworks` claims before it touches a link and gives the address back when
configuring the link fails, so an exhausted pool or a refused link leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import logging
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuop.bus import KeyExists, KeyValue, KvEntry, RevisionConflict
from gpuop.events import subjects
from gpuop.policy import IpamPool, SecondaryNetwork
from gpuop.services.network_manager.netlink import Interface

log = logging.getLogger(__name__)

CLAIMS = "addr"
RECORDS = "node"


class PoolExhausted(Exception):
    """Every address of the pool is held by another node."""

    def __init__(self, network: str, pool: IpamPool) -> None:
        super().__init__(
            f"pool {pool.cidr} of network {network} has no free address: all "
            f"{pool.size} in {pool.first}-{pool.last} are excluded or held by other nodes"
        )
        self.network = network


class ClaimValue(BaseModel):
    """What a claim and a node's record say."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    node: str
    network: str
    address: str
    """With its prefix length: `10.10.0.5/24`."""


def pool_token(subnet: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str:
    """The key token of a subnet: `10.10.0.0_24`."""
    return f"{_address_token(subnet.network_address)}_{subnet.prefixlen}"


def claim_key(address: Interface) -> str:
    """The key of the claim of `address` in its subnet."""
    return f"{CLAIMS}.{pool_token(address.network)}.{_address_token(address.ip)}"


def _address_token(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    if address.version == 6:
        return address.exploded.replace(":", "-")
    return str(address)


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
        be assignable there, and its claim must name this node (a claim that vanished is
        made again, if no other node took the address meanwhile)."""
        pool = network.ipam
        if address.network != pool.network or not pool.assignable(address.ip):
            return False
        key = claim_key(address)
        entry = await self._kv.get(key)
        if entry is None:
            return await self._try_claim(key, network.name, address)
        return self._mine(entry, network.name)

    async def claim(self, network: SecondaryNetwork) -> Interface:
        """Claim a free address of the network's pool; `PoolExhausted` when none is left."""
        pool = network.ipam
        claims = f"{CLAIMS}.{pool_token(pool.network)}.>"
        taken = {entry.key for entry in await self._entries(claims)}
        for candidate in self._walk(pool):
            address = ipaddress.ip_interface(f"{candidate}/{pool.network.prefixlen}")
            key = claim_key(address)
            if key in taken and not await self._is_mine(key, network.name):
                continue
            if await self._try_claim(key, network.name, address):
                log.info("claimed %s for network %s", address, network.name)
                return address
        raise PoolExhausted(network.name, pool)

    async def record(self, network: str, address: Interface) -> None:
        """Write this node's record of holding `address` on `network` (one writer: this
        node's agent, so a plain put is enough)."""
        value = ClaimValue(node=self._node, network=network, address=str(address))
        await self._kv.put(self.record_key(network), value.model_dump_json().encode())

    async def give_back(self, network: str, address: Interface) -> None:
        """Release this node's claim of `address` on `network`, if it still holds it."""
        key = claim_key(address)
        entry = await self._kv.get(key)
        if entry is None or not self._mine(entry, network):
            return
        with contextlib.suppress(RevisionConflict):  # someone else's claim now: keep it
            await self._kv.delete(key, revision=entry.revision)
        log.info("released %s of network %s", address, network)

    async def release(self, network: str) -> Interface | None:
        """Give back what this node holds on `network` and forget its record; the address
        released, if it held one."""
        address = await self.recorded(network)
        if address is not None:
            await self.give_back(network, address)
        await self._kv.delete(self.record_key(network))
        return address

    def _walk(self, pool: IpamPool) -> Iterator[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        digest = hashlib.sha256(self._node.encode()).digest()
        return pool.candidates(start=int.from_bytes(digest[:8], "big") % pool.size)

    async def _try_claim(self, key: str, network: str, address: Interface) -> bool:
        value = ClaimValue(node=self._node, network=network, address=str(address))
        try:
            await self._kv.create(key, value.model_dump_json().encode())
        except KeyExists:
            # taken meanwhile, or this node's own claim from before a crash
            return await self._is_mine(key, network)
        return True

    async def _is_mine(self, key: str, network: str) -> bool:
        entry = await self._kv.get(key)
        return entry is not None and self._mine(entry, network)

    def _mine(self, entry: KvEntry, network: str) -> bool:
        value = self._value_of(entry)
        return value is not None and value.node == self._node and value.network == network

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
        """The live entries whose keys match `pattern`, as they are now."""
        found: list[KvEntry] = []
        watch = self._kv.watch(pattern)
        try:
            async for entry in watch:
                if entry is None:
                    break
                if not entry.deleted:
                    found.append(entry)
        finally:
            # both buckets' watches are async generators: closing one stops its watcher
            close = getattr(watch, "aclose", None)
            if close is not None:
                await close()
        return found
