"""Twenty simulated nodes, each with its own NATS connection and network namespace, apply
one policy at the same moment and claim from one small pool: no two ever hold one address,
and the nodes left without one report `network.failed` and have no link at all."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from gpuop.bus import Buckets, NatsBus, NatsServer
from gpuop.events import network
from tests.support.networks import spec, wire

from .conftest import SimNode, addresses_of, agent, network_events, publish_policy

pytestmark = pytest.mark.nats

NODES = 20
POOL = {"cidr": "10.30.0.0/24", "rangeStart": "10.30.0.100", "rangeEnd": "10.30.0.114"}
"""Fifteen addresses for twenty nodes."""


async def test_twenty_nodes_claiming_one_small_pool_at_once_never_collide(
    make_node: Callable[[str], SimNode], nats_server: NatsServer
) -> None:
    nodes = [make_node(f"gpu-node-{i}") for i in range(NODES)]
    buses = [NatsBus(nats_server.url, name=node.name) for node in nodes]
    for bus in buses:
        await bus.start()
    try:
        await publish_policy(buses[0], spec(wire(mtu=9000, ipam=POOL)))
        agents = [
            agent(bus, node, await bus.kv(Buckets.IPAM))
            for bus, node in zip(buses, nodes, strict=True)
        ]

        await asyncio.gather(*(node_agent.converge() for node_agent in agents))

        events = await network_events(buses[0])
        claims = [
            key
            for key in await (await buses[0].kv(Buckets.IPAM)).keys()
            if key.startswith("claim.")
        ]
    finally:
        for bus in buses:
            await bus.close()
    held = {node.name: addresses_of(node.link("gpuop-roce-a") or {}) for node in nodes}
    configured = {name: found for name, found in held.items() if found}
    assert len(configured) == 15
    addresses = [address for found in configured.values() for address in found]
    assert len(addresses) == len(set(addresses)) == 15
    assert len(claims) == 15
    failed = [
        (node, payload) for node, payload in events if isinstance(payload, network.NetworkFailed)
    ]
    assert sorted(node for node, _ in failed) == sorted(set(held) - set(configured))
    for _, payload in failed:
        assert isinstance(payload, network.NetworkFailed)
        assert payload.reason is network.NetworkFailureReason.ADDRESSES_EXHAUSTED
        assert "10.30.0.100-10.30.0.114" in payload.message
    for node in nodes:
        if node.name not in configured:
            assert node.link("gpuop-roce-a") is None
            assert node.link("ens1f0")["mtu"] == 1500  # type: ignore[index]
