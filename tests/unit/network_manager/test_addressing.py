"""Address claims in the `gpuop_ipam` bucket: created if absent, so no two nodes ever hold
one address; found again after a restart; given back; and an empty pool said plainly."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from gpuop.bus import KeyValue
from gpuop.services.network_manager.addressing import (
    Addresses,
    ClaimValue,
    PoolExhausted,
    claim_key,
)
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
    await ipam.delete(claim_key(held))

    assert await Addresses(ipam, node(1)).confirm(roce, held)
    await ipam.delete(claim_key(held))
    taken = ClaimValue(node=node(2), network="roce-a", address=str(held))
    await ipam.create(claim_key(held), taken.model_dump_json().encode())
    assert not await Addresses(ipam, node(1)).confirm(roce, held)


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
    assert claim_key(held).startswith("addr.fd00-0010-0000-0000-0000-0000-0000-0000_64.")


async def test_a_malformed_entry_is_ignored_not_fatal(ipam: KeyValue) -> None:
    roce = network(ipam={**SMALL, "rangeEnd": "10.10.0.11"})
    await ipam.put("node.gpu-node-1_example_com.roce-a", b"not json")
    await ipam.create("addr.10.10.0.0_24.10.10.0.10", b"{}")

    addresses = Addresses(ipam, node(1))

    assert await addresses.recorded("roce-a") is None
    assert str(await addresses.claim(roce)) == "10.10.0.11/24"
