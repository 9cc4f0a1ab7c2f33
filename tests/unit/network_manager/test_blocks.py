"""Per-node address blocks: the allocator gives each node one block of a pool with a
`perNodeBlockSize` (once, even with two allocators racing), frees a deleted node's and says
plainly when the pool has none left; and the counting rule makes a node's claims outside
its block hold nothing, keeps every claim made before the pool had blocks, and never
changes a claim's status."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Collection

import pytest

from gpuop.bus import KeyValue
from gpuop.policy import IpamPool
from gpuop.services.network_manager import blocks
from gpuop.services.network_manager.addressing import (
    Addresses,
    BlockExhausted,
    BlockPending,
    ClaimValue,
    claim_key,
)
from tests.support.networks import network

BLOCKED = {
    "cidr": "10.10.0.0/24",
    "rangeStart": "10.10.0.10",
    "rangeEnd": "10.10.0.29",
    "perNodeBlockSize": 4,
}
SUBNET = ipaddress.ip_network("10.10.0.0/24")


def node(index: int) -> str:
    return f"gpu-node-{index}.example.com"


def nodes(*names: str) -> Callable[[], Awaitable[Collection[str]]]:
    async def listed() -> Collection[str]:
        return names

    return listed


def pool(**fields: object) -> IpamPool:
    return network(ipam={**BLOCKED, **fields}).ipam


async def blocks_by_node(ipam: KeyValue) -> dict[str, str]:
    cut = await blocks.read(ipam, SUBNET)
    return {block.node: str(block) for block in cut.blocks}


async def squat(ipam: KeyValue, name: str, roce_pool: IpamPool) -> None:
    """What a hostile agent can do with its own permissions: claim every address."""
    for address in roce_pool.candidates():
        held = ipaddress.ip_interface(f"{address}/24")
        value = ClaimValue(node=name, network="roce-a", address=str(held))
        await ipam.create(claim_key(held, name), value.model_dump_json().encode())


async def test_each_node_gets_its_own_block_of_the_range(ipam: KeyValue) -> None:
    done = await blocks.BlockAllocator(ipam).reconcile([pool()], nodes(node(1), node(2)))

    assert await blocks_by_node(ipam) == {
        node(1): "10.10.0.10-10.10.0.13",
        node(2): "10.10.0.14-10.10.0.17",
    }
    assert len(done.assigned) == 2 and not done.freed and not done.full
    again = await blocks.BlockAllocator(ipam).reconcile([pool()], nodes(node(1), node(2)))
    assert not again.assigned and not again.freed  # never moved


async def test_two_allocators_racing_never_give_a_block_twice_or_a_node_two(
    ipam: KeyValue,
) -> None:
    names = [node(i) for i in range(5)]
    first, second = blocks.BlockAllocator(ipam), blocks.BlockAllocator(ipam)

    await asyncio.gather(
        first.reconcile([pool()], nodes(*names)), second.reconcile([pool()], nodes(*names))
    )

    cut = await blocks.read(ipam, SUBNET)
    assert sorted(block.node for block in cut.blocks) == sorted(names)
    assert len({block.index for block in cut.blocks}) == 5


async def test_a_second_block_for_a_node_is_freed_and_the_first_kept(ipam: KeyValue) -> None:
    await blocks.BlockAllocator(ipam).reconcile([pool()], nodes(node(1)))
    late = blocks.BlockValue(node=node(1), first="10.10.0.26", last="10.10.0.29")
    await ipam.create(blocks.block_key(SUBNET, 4), late.model_dump_json().encode())

    done = await blocks.BlockAllocator(ipam).reconcile([pool()], nodes(node(1)))

    assert done.freed == [f"{node(1)} 10.10.0.0/24 10.10.0.26-10.10.0.29"]
    assert await blocks_by_node(ipam) == {node(1): "10.10.0.10-10.10.0.13"}


async def test_a_deleted_nodes_block_is_freed_and_given_to_a_new_node(ipam: KeyValue) -> None:
    allocator = blocks.BlockAllocator(ipam)
    await allocator.reconcile([pool()], nodes(node(1), node(2)))

    done = await allocator.reconcile([pool()], nodes(node(2), node(3)))

    assert done.freed == [f"{node(1)} 10.10.0.0/24 10.10.0.10-10.10.0.13"]
    assert await blocks_by_node(ipam) == {
        node(2): "10.10.0.14-10.10.0.17",
        node(3): "10.10.0.10-10.10.0.13",
    }


async def test_a_full_pool_names_the_pool_and_the_node_left_without(ipam: KeyValue) -> None:
    names = [node(i) for i in range(6)]  # 20 addresses: 5 blocks of 4

    done = await blocks.BlockAllocator(ipam).reconcile([pool()], nodes(*names))

    assert len(done.assigned) == 5
    (full,) = done.full
    assert full.node == node(5)
    assert "pool 10.10.0.0/24 has no block left for node gpu-node-5.example.com" in str(full)
    assert "10.10.0.10-10.10.0.29" in str(full)


async def test_a_pool_without_a_block_size_gets_no_blocks(ipam: KeyValue) -> None:
    done = await blocks.BlockAllocator(ipam).reconcile(
        [pool(perNodeBlockSize=None)], nodes(node(1))
    )

    assert not done.assigned
    assert await ipam.keys() == []


async def test_a_malformed_block_is_ignored_with_a_warning_and_its_index_skipped(
    ipam: KeyValue, caplog: pytest.LogCaptureFixture
) -> None:
    await ipam.create(blocks.since_key(SUBNET), b"{}")
    await ipam.create(blocks.block_key(SUBNET, 0), b"not json")
    await ipam.create(
        blocks.block_key(SUBNET, 1),
        blocks.BlockValue(node=node(9), first="10.9.0.1", last="10.9.0.4")
        .model_dump_json()
        .encode(),
    )

    with caplog.at_level(logging.WARNING):
        await blocks.BlockAllocator(ipam).reconcile([pool()], nodes(node(1)))

    assert await blocks_by_node(ipam) == {node(1): "10.10.0.18-10.10.0.21"}
    assert "ignoring the malformed block block.10.10.0.0_24.0" in caplog.text
    assert "10.9.0.1-10.9.0.4 is not a range of 10.10.0.0/24" in caplog.text


async def test_a_squatting_nodes_claims_outside_its_block_hold_nothing(ipam: KeyValue) -> None:
    roce = network(ipam=BLOCKED)
    await blocks.BlockAllocator(ipam).reconcile([roce.ipam], nodes(node(1), node(2)))
    await squat(ipam, node(2), roce.ipam)

    mine = await Addresses(ipam, node(1)).claim(roce)

    assert str(mine.ip) in {f"10.10.0.{i}" for i in range(10, 14)}
    theirs = await Addresses(ipam, node(2)).claim(roce)  # its one real claim still works
    assert str(theirs.ip) in {f"10.10.0.{i}" for i in range(14, 18)}


async def test_without_a_block_a_node_waits_and_claims_nothing(ipam: KeyValue) -> None:
    roce = network(ipam=BLOCKED)
    await blocks.BlockAllocator(ipam).reconcile([roce.ipam], nodes(node(1)))

    with pytest.raises(BlockPending, match=r"node gpu-node-2\.example\.com has none yet"):
        await Addresses(ipam, node(2)).claim(roce)

    assert not [key for key in await ipam.keys() if key.startswith("claim.")]


async def claim_directly(ipam: KeyValue, name: str, address: str) -> int:
    held = ipaddress.ip_interface(f"{address}/24")
    value = ClaimValue(node=name, network="roce-a", address=str(held))
    return await ipam.create(claim_key(held, name), value.model_dump_json().encode())


async def test_a_claim_made_before_the_pool_had_blocks_keeps_its_address(ipam: KeyValue) -> None:
    one = network(ipam={**BLOCKED, "perNodeBlockSize": 1})
    await claim_directly(ipam, node(3), "10.10.0.10")  # no blocks yet: as today
    await blocks.BlockAllocator(ipam).reconcile([one.ipam], nodes(node(1), node(3)))
    assert (await blocks_by_node(ipam))[node(1)] == "10.10.0.10-10.10.0.10"

    with pytest.raises(BlockExhausted) as exhausted:
        await Addresses(ipam, node(1)).claim(one)

    assert "block 10.10.0.10-10.10.0.10 of pool 10.10.0.0/24" in str(exhausted.value)
    assert "node gpu-node-1.example.com" in str(exhausted.value)
    assert not [key for key in await ipam.keys() if key.startswith("claim.gpu-node-1_")]
    kept = ipaddress.ip_interface("10.10.0.10/24")
    assert await Addresses(ipam, node(3)).confirm(one, kept)


async def test_a_claims_status_never_changes_once_made(ipam: KeyValue) -> None:
    allocator = blocks.BlockAllocator(ipam)
    before = await claim_directly(ipam, node(3), "10.10.0.15")
    await allocator.reconcile([pool()], nodes(node(1)))
    early = await claim_directly(ipam, node(2), "10.10.0.14")  # before node 2 has a block
    token2, token3 = "gpu-node-2_example_com", "gpu-node-3_example_com"
    first, second = ipaddress.ip_address("10.10.0.14"), ipaddress.ip_address("10.10.0.15")
    seen = [await blocks.read(ipam, SUBNET)]

    await allocator.reconcile([pool()], nodes(node(1), node(2), node(3)))
    seen.append(await blocks.read(ipam, SUBNET))
    assert (await blocks_by_node(ipam))[node(2)] == "10.10.0.14-10.10.0.17"

    assert [cut.counts(token2, early, first) for cut in seen] == [False, False]
    assert [cut.counts(token3, before, second) for cut in seen] == [True, True]
    got = await Addresses(ipam, node(2)).claim(network(ipam=BLOCKED))
    assert str(got.ip) in {"10.10.0.14", "10.10.0.16", "10.10.0.17"}  # .15 is node 3's
    again = await ipam.get(claim_key(ipaddress.ip_interface("10.10.0.14/24"), node(2)))
    assert again is None or again.revision > early  # the early claim withdrawn, not kept
