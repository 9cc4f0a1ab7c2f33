"""Per-node address blocks on a real nats-server under the per-node grants the auth callout
issues: network-manager's cluster role gives three nodes a block each; gpu-2's
network-manager cannot write, delete or purge a block (its own or another's), and when it
claims every free address of the pool with its own credential the other nodes still get
their addresses, inside their blocks. Every attempt's outcome is printed."""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator, Collection
from pathlib import Path

import nats
import pytest

from gpuop.bus import grants
from gpuop.bus.protocol import Buckets
from gpuop.services.network_manager import blocks
from gpuop.services.network_manager.addressing import Addresses, ClaimValue, claim_key
from tests.integration.deploy.per_node_nats import PerNodeNats, user_name
from tests.support.networks import network
from tests.support.shipped_nats import Refusals

pytestmark = [pytest.mark.nats, pytest.mark.security]

MINE, SQUATTER, THIRD = "gpu-1.example.com", "gpu-2.example.com", "gpu-3.example.com"
NODES = (MINE, SQUATTER, THIRD)
CLUSTER = grants.Identity("network-manager-cluster", None)
POOL = {
    "cidr": "10.10.0.0/24",
    "rangeStart": "10.10.0.10",
    "rangeEnd": "10.10.0.21",
    "perNodeBlockSize": 4,
}
SUBNET = ipaddress.ip_network("10.10.0.0/24")


def agent(node: str) -> grants.Identity:
    return grants.Identity("network-manager", node)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[PerNodeNats]:
    running = PerNodeNats(tmp_path / "nats", [*map(agent, NODES), CLUSTER])
    await running.start()
    admin = running.bus(None)
    try:
        await admin.start()
        await admin.close()
        yield running
    finally:
        await running.stop()


async def listed() -> Collection[str]:
    return NODES


async def test_a_node_claiming_every_free_address_leaves_the_others_theirs(
    server: PerNodeNats,
) -> None:
    roce = network(ipam=POOL)
    cluster, squatter, mine, third = (
        server.bus(CLUSTER),
        *(server.bus(agent(node)) for node in (SQUATTER, MINE, THIRD)),
    )
    refusals = Refusals()
    rows: list[tuple[str, str, str]] = []
    try:
        for bus in (cluster, squatter, mine, third):
            await bus.start()
        done = await blocks.BlockAllocator(await cluster.kv(Buckets.IPAM)).reconcile(
            [roce.ipam], listed
        )
        assert len(done.assigned) == 3, done
        cut = await blocks.read(await mine.kv(Buckets.IPAM), SUBNET)  # read as a node agent
        given = {block.node: block for block in cut.blocks}
        assert set(given) == set(NODES)

        refusals.nc = await nats.connect(
            server.url(user_name(agent(SQUATTER))),
            inbox_prefix=grants.for_identity(agent(SQUATTER)).inbox_prefix,
            error_cb=refusals.record,
            allow_reconnect=False,
        )
        tried = [
            ("write a block of its own", blocks.block_key(SUBNET, 7), {}),
            ("overwrite gpu-1's block", blocks.block_key(SUBNET, given[MINE].index), {}),
            (
                "delete gpu-1's block",
                blocks.block_key(SUBNET, given[MINE].index),
                {"KV-Operation": "DEL"},
            ),
            ("delete the epoch", blocks.since_key(SUBNET), {"KV-Operation": "DEL"}),
            (
                "purge the blocks",
                blocks.block_key(SUBNET, given[SQUATTER].index),
                {"KV-Operation": "PURGE", "Nats-Rollup": "sub"},
            ),
        ]
        for _, key, headers in tried:
            await refusals.nc.publish(f"$KV.gpuop_ipam.{key}", b"{}", headers=headers)
        await refusals.settle()
        for what, key, _ in tried:
            refused = refusals.refused_publish(f"$KV.gpuop_ipam.{key}")
            rows.append((what, key, "refused" if refused else "ALLOWED"))

        squatter_kv = await squatter.kv(Buckets.IPAM)
        squatted = 0
        for address in roce.ipam.candidates():
            held = ipaddress.ip_interface(f"{address}/24")
            value = ClaimValue(node=SQUATTER, network=roce.name, address=str(held))
            await squatter_kv.create(claim_key(held, SQUATTER), value.model_dump_json().encode())
            squatted += 1
        rows.append(("claim every address", f"claim.gpu-2_example_com.* ({squatted})", "allowed"))

        for node, bus in ((MINE, mine), (THIRD, third)):
            got = await Addresses(await bus.kv(Buckets.IPAM), node).claim(roce)
            inside = given[node].holds(got.ip)
            rows.append((f"{node} claims", str(got), "in its block" if inside else "OUTSIDE"))
    finally:
        if hasattr(refusals, "nc"):
            await refusals.nc.close()
        for bus in (third, mine, squatter, cluster):
            await bus.close()
    print(f"\nnetwork-manager@{SQUATTER} against the blocks of pool {POOL['cidr']}:")
    for what, subject, outcome in rows:
        print(f"  {what:<26} {subject:<48} {outcome}")
    assert [r for r in rows if r[2] not in ("refused", "allowed", "in its block")] == []
