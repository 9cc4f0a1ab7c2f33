"""Address claims in the `gpuop_ipam` bucket: each node writes only its own claims, the
earliest live claim of an address holds it, so no two nodes ever hold one address and none
displaces another; found again after a restart; given back; old claims honoured; and an
empty pool said plainly."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from gpuop.bus import KeyValue
from gpuop.bus.memory import MemoryKeyValue
from gpuop.services.network_manager.addressing import (
    Addresses,
    ClaimValue,
    PoolExhausted,
    claim_key,
    legacy_claim_key,
)
from gpuop.services.network_manager.netlink import Interface
from tests.support.networks import network

SMALL = {"cidr": "10.10.0.0/24", "rangeStart": "10.10.0.10", "rangeEnd": "10.10.0.29"}


def node(index: int) -> str:
    return f"gpu-node-{index}.example.com"


async def test_twenty_nodes_claiming_at_once_get_twenty_distinct_addresses(ipam: KeyValue) -> None:
    roce = network(ipam=SMALL)
    nodes = [Addresses(ipam, node(i)) for i in range(20)]

    claimed = await asyncio.gather(*(addresses.claim(roce) for addresses in nodes))

    assert len(set(claimed)) == 20
    assert {str(a.ip) for a in claimed} == {f"10.10.0.{i}" for i in range(10, 30)}
    assert len(await ipam.keys()) == 20  # every lost race's claim withdrawn


async def test_an_exhausted_pool_is_refused_with_the_range_named(ipam: KeyValue) -> None:
    roce = network(ipam={**SMALL, "rangeEnd": "10.10.0.11"})
    await Addresses(ipam, node(1)).claim(roce)
    await Addresses(ipam, node(2)).claim(roce)

    with pytest.raises(PoolExhausted) as exhausted:
        await Addresses(ipam, node(3)).claim(roce)

    assert "10.10.0.0/24" in str(exhausted.value) and "10.10.0.10-10.10.0.11" in str(
        exhausted.value
    )
    assert len(await ipam.keys()) == 2


async def test_gateway_and_exclusions_are_never_claimed(ipam: KeyValue) -> None:
    roce = network(
        ipam={
            **SMALL,
            "rangeEnd": "10.10.0.13",
            "gateway": "10.10.0.10",
            "exclude": ["10.10.0.12/31"],
        }
    )

    first = await Addresses(ipam, node(1)).claim(roce)

    assert str(first) == "10.10.0.11/24"
    with pytest.raises(PoolExhausted):
        await Addresses(ipam, node(2)).claim(roce)


async def test_a_claim_made_just_before_a_crash_is_found_again(ipam: KeyValue) -> None:
    roce = network(ipam=SMALL)
    before_crash = await Addresses(ipam, node(1)).claim(roce)  # the record was never written

    after_restart = await Addresses(ipam, node(1)).claim(roce)

    assert after_restart == before_crash
    assert len(await ipam.keys()) == 1


async def test_the_record_survives_a_restart_and_confirms_the_claim(ipam: KeyValue) -> None:
    roce = network(ipam=SMALL)
    held = await Addresses(ipam, node(1)).claim(roce)
    await Addresses(ipam, node(1)).record("roce-a", held)

    restarted = Addresses(ipam, node(1))

    assert await restarted.recorded("roce-a") == held
    assert await restarted.records() == {"roce-a": held}
    assert await restarted.confirm(roce, held)


async def test_a_vanished_claim_is_made_again_unless_another_node_took_the_address(
    ipam: KeyValue,
) -> None:
    roce = network(ipam=SMALL)
    held = await Addresses(ipam, node(1)).claim(roce)
    await ipam.delete(claim_key(held, node(1)))

    assert await Addresses(ipam, node(1)).confirm(roce, held)
    await ipam.delete(claim_key(held, node(1)))
    await claim_as(ipam, node(2), held)
    assert not await Addresses(ipam, node(1)).confirm(roce, held)
    assert await ipam.get(claim_key(held, node(1))) is None


async def test_an_address_outside_the_current_pool_is_not_confirmed(ipam: KeyValue) -> None:
    held = await Addresses(ipam, node(1)).claim(network(ipam=SMALL))
    moved = network(ipam={"cidr": "10.20.0.0/24"})
    narrowed = network(ipam={**SMALL, "exclude": [str(held.ip)]})

    assert not await Addresses(ipam, node(1)).confirm(moved, held)
    assert not await Addresses(ipam, node(1)).confirm(narrowed, held)


async def test_release_gives_the_address_back_and_forgets_the_record(ipam: KeyValue) -> None:
    roce = network(ipam={**SMALL, "rangeEnd": "10.10.0.10"})
    addresses = Addresses(ipam, node(1))
    held = await addresses.claim(roce)
    await addresses.record("roce-a", held)

    released = await addresses.release("roce-a")

    assert released == held
    assert await ipam.keys() == []
    assert await Addresses(ipam, node(2)).claim(roce) == held


async def test_giving_back_never_releases_another_nodes_claim(ipam: KeyValue) -> None:
    roce = network(ipam=SMALL)
    theirs = await Addresses(ipam, node(2)).claim(roce)

    await Addresses(ipam, node(1)).give_back("roce-a", theirs)

    assert await Addresses(ipam, node(2)).confirm(roce, theirs)


async def test_networks_sharing_a_subnet_share_its_addresses(ipam: KeyValue) -> None:
    one = network("roce-a", ipam={**SMALL, "rangeEnd": "10.10.0.10"})
    other = network("roce-b", ipam={**SMALL, "rangeEnd": "10.10.0.10"})
    await Addresses(ipam, node(1)).claim(one)

    with pytest.raises(PoolExhausted):
        await Addresses(ipam, node(2)).claim(other)


async def test_ipv6_addresses_make_valid_keys(ipam: KeyValue) -> None:
    roce = network(
        ipam={"cidr": "fd00:10::/64", "rangeStart": "fd00:10::10", "rangeEnd": "fd00:10::1f"}
    )

    held = await Addresses(ipam, node(1)).claim(roce)

    assert held.network == ipaddress.ip_network("fd00:10::/64")
    assert claim_key(held, node(1)).startswith(
        "claim.gpu-node-1_example_com.fd00-0010-0000-0000-0000-0000-0000-0000_64."
    )
    assert await ipam.keys() == [claim_key(held, node(1))]


async def test_a_malformed_record_or_old_claim_is_ignored_not_fatal(ipam: KeyValue) -> None:
    roce = network(ipam={**SMALL, "rangeEnd": "10.10.0.11"})
    await ipam.put("node.gpu-node-1_example_com.roce-a", b"not json")
    await ipam.create("addr.10.10.0.0_24.10.10.0.10", b"{}")

    addresses = Addresses(ipam, node(1))

    assert await addresses.recorded("roce-a") is None
    assert str(await addresses.claim(roce)) == "10.10.0.11/24"


X = ipaddress.ip_interface("10.10.0.10/24")
"""The first address of a pool of two (`TWO`)."""
TWO = {**SMALL, "rangeEnd": "10.10.0.11"}


async def claim_as(kv: KeyValue, claimer: str, address: Interface) -> int:
    """`claimer`'s claim of `address`, written as its agent writes it."""
    value = ClaimValue(node=claimer, network="roce-a", address=str(address))
    return await kv.create(claim_key(address, claimer), value.model_dump_json().encode())


class RacedKv(MemoryKeyValue):
    """A bucket in which another node's claim lands just before a given claim is created,
    after the claimer looked at the pool: the race that the earliest claim decides."""

    def __init__(self, raced: dict[str, str]) -> None:
        super().__init__("ipam")
        self.raced = raced
        """The key whose create is raced -> the node that gets there first."""

    async def create(self, key: str, value: bytes) -> int:
        first = self.raced.pop(key, None)
        if first is not None:
            await claim_as(self, first, X)
        return await super().create(key, value)


def walks_to_x_first(index: int = 1) -> str:
    """A node whose walk of `TWO` starts at `X`."""
    return next(
        node(i)
        for i in range(index, 100)
        if next(Addresses(MemoryKeyValue("probe"), node(i))._walk(network(ipam=TWO).ipam)) == X.ip
    )


async def test_of_two_racing_claims_the_earlier_holds_the_address_and_the_later_moves_on() -> None:
    me = walks_to_x_first()
    kv = RacedKv({claim_key(X, me): node(99)})

    mine = await Addresses(kv, me).claim(network(ipam=TWO))

    assert str(mine) == "10.10.0.11/24"
    assert await kv.get(claim_key(X, me)) is None  # withdrawn
    assert await kv.get(claim_key(X, node(99))) is not None
    assert await Addresses(kv, node(99)).confirm(network(ipam=TWO), X)
    assert not await Addresses(kv, me).confirm(network(ipam=TWO), X)


async def test_a_later_claim_never_displaces_the_earlier_one(ipam: KeyValue) -> None:
    roce = network(ipam=TWO)
    await claim_as(ipam, node(2), X)
    await claim_as(ipam, node(1), X)  # made by a node that crashed before looking

    assert await Addresses(ipam, node(2)).confirm(roce, X)
    assert not await Addresses(ipam, node(1)).confirm(roce, X)
    assert await ipam.get(claim_key(X, node(1))) is None  # its lost claim withdrawn
    assert await ipam.get(claim_key(X, node(2))) is not None


async def test_a_lost_claim_left_by_a_crash_is_withdrawn_when_the_node_claims_again(
    ipam: KeyValue,
) -> None:
    await claim_as(ipam, node(2), X)
    await claim_as(ipam, node(1), X)

    mine = await Addresses(ipam, node(1)).claim(network(ipam=TWO))

    assert str(mine) == "10.10.0.11/24"
    assert sorted(await ipam.keys()) == sorted([claim_key(X, node(2)), claim_key(mine, node(1))])


async def test_a_deleted_claim_no_longer_counts_and_the_next_earliest_holds_the_address(
    ipam: KeyValue,
) -> None:
    roce = network(ipam=TWO)
    await claim_as(ipam, node(2), X)
    await claim_as(ipam, node(1), X)
    await Addresses(ipam, node(2)).give_back("roce-a", X)

    assert await ipam.get(claim_key(X, node(2))) is None
    assert await Addresses(ipam, node(1)).confirm(roce, X)
    assert not await Addresses(ipam, node(2)).confirm(roce, X)  # node 1 holds it now


async def test_a_claim_of_the_same_node_for_another_network_on_the_subnet_is_kept(
    ipam: KeyValue,
) -> None:
    one = network("roce-a", ipam=TWO)
    other = network("roce-b", ipam=TWO)
    first = await Addresses(ipam, node(1)).claim(one)

    second = await Addresses(ipam, node(1)).claim(other)

    assert first != second
    assert await Addresses(ipam, node(1)).confirm(one, first)
    assert not await Addresses(ipam, node(1)).confirm(other, first)
    assert await Addresses(ipam, node(1)).confirm(one, first)  # still held
    await Addresses(ipam, node(1)).give_back("roce-b", first)
    assert await Addresses(ipam, node(1)).confirm(one, first)


async def test_an_old_claim_holds_its_address_for_the_node_it_names(ipam: KeyValue) -> None:
    roce = network(ipam=TWO)
    old = ClaimValue(node=node(2), network="roce-a", address=str(X))
    await ipam.create(legacy_claim_key(X), old.model_dump_json().encode())

    assert str(await Addresses(ipam, node(1)).claim(roce)) == "10.10.0.11/24"
    with pytest.raises(PoolExhausted):
        await Addresses(ipam, node(3)).claim(roce)
    assert await Addresses(ipam, node(2)).confirm(roce, X)  # and adds its own claim
    assert await ipam.get(claim_key(X, node(2))) is not None

    await ipam.delete(legacy_claim_key(X))  # the administrator, once every agent migrated
    assert await Addresses(ipam, node(2)).confirm(roce, X)
    assert not await Addresses(ipam, node(3)).confirm(roce, X)


async def test_an_old_claim_is_not_deleted_by_its_node_and_keeps_the_address(
    ipam: KeyValue, caplog: pytest.LogCaptureFixture
) -> None:
    roce = network(ipam=TWO)
    old = ClaimValue(node=node(1), network="roce-a", address=str(X))
    await ipam.create(legacy_claim_key(X), old.model_dump_json().encode())
    assert await Addresses(ipam, node(1)).confirm(roce, X)

    await Addresses(ipam, node(1)).give_back("roce-a", X)

    assert await ipam.keys() == [legacy_claim_key(X)]
    assert "delete it as an administrator" in caplog.text
    assert not await Addresses(ipam, node(2)).confirm(roce, X)
