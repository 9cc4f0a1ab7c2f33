"""Per-node address blocks in the `gpuop_ipam` bucket (nv-ipam's `perNodeBlockSize`), so
that no node's agent can take a pool's every free address.

A node may create a claim (`claim.<node>.<subnet>.<address>`) for any address: subject
permissions bind a claim to its node, they cannot count claims. So for a pool with a
`perNodeBlockSize` the cluster role (`BlockAllocator`, run by network-manager's controller)
gives each node one block of the range, and a node's claims count only inside its block.
Two kinds of keys, written only by the cluster role (`gpuop.bus.grants`):

    block.<subnet>.since    created once, before the subnet's first block, never rewritten
                            or deleted: its revision is the subnet's *epoch*
    block.<subnet>.<index>  block `index` of the range (from 0), naming its node, created if
                            absent (so no block is given twice) and never rewritten

A node's block in a subnet is the earliest live block that names it. Two allocators racing
for one node can each create a block for it; the later one is never the node's block and
the allocator deletes it. A node's block is freed (deleted) when the node is deleted.

The counting rule, which every reader applies (`SubnetBlocks.counts`): a claim with revision
`r` counts when the subnet has no epoch or `r` is below the epoch (claims made before any
block existed count as they always did, so a running cluster keeps its addresses), or when
its node's block was created before the claim (`revision < r`) and holds the address. Of an
address's counting claims the earliest holds it (`addressing`).

Why a claim's counting status never changes while its node exists, which is what keeps two
nodes from holding one address (two readers deciding differently, or one reader deciding
differently over time, would let two claims each see themselves as the earliest counting
one): it depends only on the claim's revision and address (a node never rewrites a claim),
on the epoch (created once, never written again, deleted by nobody) and on the node's block,
which is fixed from the moment it is created: blocks are never rewritten, a later block can
only come after it (revisions grow), so it never stops being the earliest, and the allocator
deletes a node's earliest block only when the node is gone. A claim made before its node's
block was created (`r` above the epoch) never counts, not even once the block exists. When
a node is deleted its blocks go and so does every claim it made after the epoch; those are
the only claims whose status changes, and their node no longer uses them. A reader reads the
blocks after its own claim exists (`addressing.Addresses`), so it sees the epoch and every
block that decides a claim made before its own: a block decides a claim only if it is
earlier than the claim.

Changing a blocked pool's range or block size keeps the blocks already given (their value
holds their range); new blocks are cut the new way. Removing `perNodeBlockSize` keeps the
subnet blocked (the epoch stays): nodes without a block then wait.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuop.bus import KeyExists, KeyValue, KvEntry, RevisionConflict
from gpuop.events import subjects
from gpuop.policy import IpamPool

log = logging.getLogger(__name__)

BLOCKS = "block"
SINCE = "since"
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Subnet = ipaddress.IPv4Network | ipaddress.IPv6Network


def pool_token(subnet: Subnet) -> str:
    """The key token of a subnet: `10.10.0.0_24`."""
    return f"{address_token(subnet.network_address)}_{subnet.prefixlen}"


def address_token(address: Address) -> str:
    """An address in a key: IPv6 written out in full with `-` for `:`."""
    if address.version == 6:
        return address.exploded.replace(":", "-")
    return str(address)


def since_key(subnet: Subnet) -> str:
    return f"{BLOCKS}.{pool_token(subnet)}.{SINCE}"


def block_key(subnet: Subnet, index: int) -> str:
    return f"{BLOCKS}.{pool_token(subnet)}.{index}"


def blocks_filter(subnet: Subnet) -> str:
    """The epoch and every block of `subnet`."""
    return f"{BLOCKS}.{pool_token(subnet)}.*"


class BlockValue(BaseModel):
    """What a block key says: its node and its first and last address."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    node: str
    first: str
    last: str


@dataclass(frozen=True, slots=True)
class Block:
    """One node's block, as read."""

    index: int
    node: str
    first: Address
    last: Address
    revision: int

    @property
    def token(self) -> str:
        return subjects.encode_node(self.node)

    def holds(self, address: Address) -> bool:
        return address.version == self.first.version and (
            int(self.first) <= int(address) <= int(self.last)
        )

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


@dataclass(frozen=True, slots=True)
class SubnetBlocks:
    """The epoch and the live blocks of one subnet."""

    epoch: int | None = None
    """The revision of `block.<subnet>.since`; None while the subnet has no blocks."""
    blocks: tuple[Block, ...] = ()
    """Live, well-formed blocks, earliest first."""
    taken: frozenset[int] = frozenset()
    """Every index with a live key, malformed ones included (none can be created there)."""

    def of(self, token: str) -> Block | None:
        """The block of the node with subject token `token`: its earliest."""
        return next((block for block in self.blocks if block.token == token), None)

    def counts(self, token: str, revision: int, address: Address) -> bool:
        """Whether the claim by `token` made at `revision` for `address` counts (see the
        module docstring)."""
        if self.epoch is None or revision < self.epoch:
            return True
        block = self.of(token)
        return block is not None and block.revision < revision and block.holds(address)


async def live_entries(kv: KeyValue, pattern: str) -> list[KvEntry]:
    """The live entries whose keys match `pattern`, as they are now."""
    found: list[KvEntry] = []
    watch = kv.watch(pattern)
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


async def read(kv: KeyValue, subnet: Subnet) -> SubnetBlocks:
    """The epoch and blocks of `subnet` as they are now; malformed blocks are left out
    with a warning (their index stays taken)."""
    epoch: int | None = None
    blocks: list[Block] = []
    taken: set[int] = set()
    for entry in await live_entries(kv, blocks_filter(subnet)):
        name = entry.key.rpartition(".")[2]
        if name == SINCE:
            epoch = entry.revision
        elif name.isdigit():
            taken.add(int(name))
            block = _block_of(entry, int(name), subnet)
            if block is not None:
                blocks.append(block)
        else:
            log.warning("ignoring %s: no block index", entry.key)
    blocks.sort(key=lambda block: block.revision)
    return SubnetBlocks(epoch, tuple(blocks), frozenset(taken))


def _block_of(entry: KvEntry, index: int, subnet: Subnet) -> Block | None:
    try:
        value = BlockValue.model_validate_json(entry.value)
        first, last = ipaddress.ip_address(value.first), ipaddress.ip_address(value.last)
        subjects.validate_node_name(value.node)
    except (ValidationError, ValueError) as error:
        log.warning("ignoring the malformed block %s: %s", entry.key, error)
        return None
    if first not in subnet or last not in subnet or int(first) > int(last):
        log.warning(
            "ignoring the block %s: %s-%s is not a range of %s", entry.key, first, last, subnet
        )
        return None
    return Block(index, value.node, first, last, entry.revision)


NodeLister = Callable[[], Awaitable[Collection[str]]]
"""The names of the nodes that get blocks, as they are now."""


class BlocksFull(Exception):
    """Every block of a pool is given to another node."""

    def __init__(self, pool: IpamPool, node: str) -> None:
        super().__init__(
            f"pool {pool.cidr} has no block left for node {node}: all {pool.block_count} "
            f"blocks of {pool.per_node_block_size} addresses in {pool.first}-{pool.last} are "
            "given to other nodes; raise the range or lower perNodeBlockSize"
        )
        self.node = node


@dataclass
class Allocation:
    """What one pass of the allocator did."""

    assigned: list[str] = field(default_factory=list)
    """`<node> <subnet> <first>-<last>` per block given."""
    freed: list[str] = field(default_factory=list)
    full: list[BlocksFull] = field(default_factory=list)


class BlockAllocator:
    """Gives each node one block per blocked subnet, and frees the blocks of nodes that
    are gone; any number of allocators may run at once."""

    ATTEMPTS = 8

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def reconcile(self, pools: Iterable[IpamPool], nodes: NodeLister) -> Allocation:
        """One pass over every pool with a block size, for the nodes `nodes` lists. The
        nodes are listed after a subnet's blocks are read, so a block given meanwhile by
        another allocator to a node this one has not seen yet is never freed."""
        done = Allocation()
        seen: set[str] = set()
        for pool in pools:
            if pool.per_node_block_size is None or pool.cidr in seen:
                continue
            seen.add(pool.cidr)
            await self._subnet(pool, nodes, done)
        return done

    async def _subnet(self, pool: IpamPool, list_nodes: NodeLister, done: Allocation) -> None:
        subnet = pool.network
        with contextlib.suppress(KeyExists):
            await self._kv.create(since_key(subnet), b"{}")
        current = await read(self._kv, subnet)
        nodes = await list_nodes()
        wanted = {subjects.encode_node(node) for node in nodes}
        kept: set[str] = set()
        for block in current.blocks:
            if block.token not in wanted or block.token in kept:
                await self._free(subnet, block, done)
            else:
                kept.add(block.token)
        for node in sorted(nodes):
            if subjects.encode_node(node) not in kept:
                await self._assign(pool, node, done)

    async def _free(self, subnet: Subnet, block: Block, done: Allocation) -> None:
        with contextlib.suppress(RevisionConflict):
            await self._kv.delete(block_key(subnet, block.index), revision=block.revision)
        done.freed.append(f"{block.node} {subnet} {block}")
        log.info("freed block %s of %s from node %s", block, subnet, block.node)

    async def _assign(self, pool: IpamPool, node: str, done: Allocation) -> None:
        """Create the lowest free block for `node` unless another allocator gave it one."""
        subnet, token = pool.network, subjects.encode_node(node)
        for _ in range(self.ATTEMPTS):
            current = await read(self._kv, subnet)
            if current.of(token) is not None:
                return
            index = next((i for i in range(pool.block_count) if i not in current.taken), None)
            if index is None:
                full = BlocksFull(pool, node)
                log.error("%s", full)
                done.full.append(full)
                return
            first, last = pool.block(index)
            value = BlockValue(node=node, first=str(first), last=str(last))
            try:
                await self._kv.create(block_key(subnet, index), value.model_dump_json().encode())
            except KeyExists:
                continue  # another allocator took it: look again
            done.assigned.append(f"{node} {subnet} {first}-{last}")
            log.info("gave node %s block %s-%s of %s", node, first, last, subnet)
            return
        log.warning("the blocks of %s keep changing: node %s gets one next pass", subnet, node)
