"""The node role's agent: it follows the published policy, reports each network's outcome
once, answers `ApplyNetwork`, reconverges after an OFED reload, and leaves the links alone
while NATS is down."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gpuop.bus import Buckets, BusError, Delivery, InMemoryBus, NatsBus, NatsServer, TemporaryError
from gpuop.events import decode, driver, network, new_command, new_event
from gpuop.services.network_manager import blocks
from gpuop.services.network_manager.node_agent import NodeAgent
from tests.support.networks import MANAGEMENT_NIC, spec, wire
from tests.support.waiting import eventually

from .conftest import SimNode, agent, network_events, publish_policy

MakeNode = Callable[[str], SimNode]
POOL = {"cidr": "192.168.100.0/24", "rangeStart": "192.168.100.10", "rangeEnd": "192.168.100.20"}


@asynccontextmanager
async def running(node_agent: NodeAgent) -> AsyncIterator[asyncio.Event]:
    stopping = asyncio.Event()
    task = asyncio.create_task(node_agent.run(stopping))
    try:
        yield stopping
    finally:
        stopping.set()
        await asyncio.wait_for(task, 10)


def of_type(events: list[tuple[str, object]], kind: type) -> list[object]:
    return [payload for _, payload in events if isinstance(payload, kind)]


async def test_the_agent_follows_the_published_policy_and_reports_each_outcome_once(
    make_node: MakeNode, bus: InMemoryBus
) -> None:
    node = make_node("gpu-node-1")
    ipam = await bus.kv(Buckets.IPAM)
    revision = await publish_policy(bus, spec(wire(mtu=9000, ipam=POOL)))

    async with running(agent(bus, node, ipam)):

        async def configured() -> bool:
            return bool(of_type(await network_events(bus), network.NetworkConfigured))

        await eventually(configured)
        link = node.link("gpuop-roce-a")
        assert link is not None and link["mtu"] == 9000
        removed_at = await publish_policy(bus, spec(), generation=2)

        async def removed() -> bool:
            return bool(of_type(await network_events(bus), network.NetworkRemoved))

        await eventually(removed)

    events = await network_events(bus)
    (done,) = of_type(events, network.NetworkConfigured)
    assert isinstance(done, network.NetworkConfigured)
    assert (done.network, done.interface, done.master, done.mtu) == (
        "roce-a",
        "gpuop-roce-a",
        "ens1f0",
        9000,
    )
    assert done.policy_revision == revision
    (gone,) = of_type(events, network.NetworkRemoved)
    assert isinstance(gone, network.NetworkRemoved)
    assert gone.addresses == done.addresses and gone.policy_revision == removed_at
    (rdma,) = of_type(events, network.RdmaDevicesDiscovered)
    assert isinstance(rdma, network.RdmaDevicesDiscovered)
    assert rdma.management_interfaces == (MANAGEMENT_NIC,)
    assert len(rdma.devices) == 3
    assert node.link("gpuop-roce-a") is None


async def test_nothing_is_touched_before_a_policy_is_published(
    make_node: MakeNode, bus: InMemoryBus
) -> None:
    node = make_node("gpu-node-1")
    node.ip("link", "add", "gpuop-old", "link", "ens1f0", "type", "macvlan")
    node.ip("link", "set", "gpuop-old", "alias", "gpuop:old")
    node_agent = agent(bus, node, await bus.kv(Buckets.IPAM))

    assert await node_agent.converge() is None
    assert node.link("gpuop-old") is not None


async def test_apply_network_republishes_every_outcome_as_an_answer(
    make_node: MakeNode, bus: InMemoryBus
) -> None:
    node = make_node("gpu-node-1")
    node_agent = agent(bus, node, await bus.kv(Buckets.IPAM))
    revision = await publish_policy(
        bus, spec(wire(ipam=POOL), wire("bad", master={"interface": "ens9f9"}, ipam=POOL))
    )
    await node_agent.converge()
    entry = await (await bus.kv(Buckets.CONFIG)).get("network")
    assert entry is not None
    command = new_command(
        network.ApplyNetwork(
            policy_revision=revision, policy_hash=hashlib.sha256(entry.value).hexdigest()
        ),
        node=node.name,
        source="/gpuop/test",
        id="apply-1",
    )

    async with running(node_agent):
        await bus.publish(command)

        async def answered() -> bool:
            return sum(1 for _ in of_type(await network_events(bus), network.NetworkFailed)) == 2

        await eventually(answered)

    answers = [decode(stored.data) async for stored in bus.read(f"{bus.prefix}.evt.network.>")]
    caused = sorted(
        type(payload).__name__ for envelope, payload in answers if envelope.causationid == "apply-1"
    )
    assert caused == ["NetworkConfigured", "NetworkFailed"]  # every network answers


async def test_an_apply_for_a_revision_not_yet_published_is_retried(
    make_node: MakeNode, bus: InMemoryBus
) -> None:
    node = make_node("gpu-node-1")
    node_agent = agent(bus, node, await bus.kv(Buckets.IPAM))
    revision = await publish_policy(bus, spec(wire(ipam=POOL)))
    command = network.ApplyNetwork(policy_revision=revision + 5, policy_hash="0" * 64)
    envelope = new_command(command, node=node.name, source="/gpuop/test", id="apply-2")

    with pytest.raises(TemporaryError, match="revision"):
        await node_agent.on_command(Delivery("s", envelope, command, 1, 1))
    assert node.link("gpuop-roce-a") is None


async def test_an_ofed_reload_makes_the_agent_converge_again(
    make_node: MakeNode, bus: InMemoryBus
) -> None:
    node = make_node("gpu-node-1")
    await publish_policy(bus, spec(wire(ipam=POOL)))
    node_agent = agent(bus, node, await bus.kv(Buckets.IPAM), resync_interval_seconds=3600)

    async with running(node_agent):

        async def present() -> bool:
            return node.link("gpuop-roce-a") is not None

        await eventually(present)
        node.ip("link", "del", "gpuop-roce-a")  # what a reload of mlx5_core does to it
        loaded = driver.DriverLoaded(
            command_id="load-1",
            component=driver.Component.OFED,
            version="24.10-1.1.4.0",
            modules_loaded=("mlx5_core", "ib_core", "mlx5_ib"),
        )
        await bus.publish(new_event(loaded, node=node.name, source="/gpuop/driver-manager"))
        await eventually(present)


@pytest.mark.nats
async def test_while_nats_is_down_the_links_stay_and_the_agent_catches_up(
    make_node: MakeNode, tmp_path: Path
) -> None:
    server = NatsServer(tmp_path / "nats")
    await server.start()
    bus = NatsBus(server.url, retry_for=1.0, publish_timeout=0.5)
    await bus.start()
    node = make_node("gpu-node-1")
    try:
        node_agent = agent(bus, node, await bus.kv(Buckets.IPAM))
        await publish_policy(bus, spec(wire(ipam=POOL)))
        await node_agent.converge()
        before = node.layout()
        await server.stop()

        with pytest.raises(BusError):
            await node_agent.converge()
        assert node.layout() == before

        await server.start()
        await publish_policy(bus, spec(wire(mtu=1400, ipam=POOL)))
        result = await node_agent.converge()
    finally:
        await bus.close()
        await server.stop()
    assert result is not None
    link = node.link("gpuop-roce-a")
    assert link is not None and link["mtu"] == 1400


async def test_an_agent_without_its_block_says_so_and_tries_again_soon(
    make_node: MakeNode, bus: InMemoryBus
) -> None:
    node = make_node("gpu-node-1")
    ipam = await bus.kv(Buckets.IPAM)
    blocked = spec(wire(ipam={**POOL, "perNodeBlockSize": 4}))
    await publish_policy(bus, blocked)

    async def listed() -> list[str]:
        return [node.name]

    # the resync interval is far away: only the retry of a waiting pass gets the link up
    async with running(agent(bus, node, ipam, resync_interval_seconds=3600)):

        async def waiting() -> bool:
            return bool(of_type(await network_events(bus), network.NetworkFailed))

        await eventually(waiting)
        await asyncio.sleep(0.5)  # the wake-ups of the start (the policy's watch) are spent
        await blocks.BlockAllocator(ipam).reconcile([blocked.networks[0].ipam], listed)

        async def configured() -> bool:
            return bool(of_type(await network_events(bus), network.NetworkConfigured))

        await eventually(configured)

    (failed,) = of_type(await network_events(bus), network.NetworkFailed)
    assert isinstance(failed, network.NetworkFailed)
    assert failed.reason is network.NetworkFailureReason.OTHER
    assert "node gpu-node-1 has none yet: waiting for network-manager's cluster role" in (
        failed.message
    )
