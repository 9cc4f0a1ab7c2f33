"""The Node label `nvidia.com/mig.config` through discovery's cluster role, against the
simulated API server: each change becomes a `device.mig-config-requested` on the node's
subject (what starts the node's MIG reconfiguration), with the same Node watch that tells
the device plugin its config, and a restarted cluster role tells only what changed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gpuop.bus import InMemoryBus
from gpuop.events import decode, mig_requests, new_event
from gpuop.kube import client, nodes
from gpuop.services.discovery.selections import (
    CONFIG_LABEL,
    MIG_CONFIG,
    MIG_CONFIG_LABEL,
    Selections,
)
from gpuop_sim import ApiServer
from tests.support.discovered import NODE, node_object

OTHER = "gpu-2.example.com"


@pytest.fixture
async def bus() -> AsyncIterator[InMemoryBus]:
    running = InMemoryBus()
    await running.start()
    yield running
    await running.close()


async def requested(bus: InMemoryBus) -> list[tuple[str, str | None]]:
    """Every MIG config request published: (node, label value)."""
    found = []
    async for message in bus.read(MIG_CONFIG.filter(bus.prefix)):
        envelope, payload = decode(message.data)
        assert isinstance(payload, mig_requests.MigConfigRequested)
        found.append((envelope.node, payload.config))
    return found


async def wait_requested(bus: InMemoryBus, expected: list[tuple[str, str | None]]) -> None:
    async with asyncio.timeout(10):
        while await requested(bus) != expected:
            await asyncio.sleep(0.02)


async def test_each_change_of_a_nodes_mig_label_is_a_request(
    server: ApiServer, kube: client.Kube, bus: InMemoryBus
) -> None:
    server.seed(node_object(labels={MIG_CONFIG_LABEL: "all-balanced"}))
    server.seed({**node_object(), "metadata": {"name": OTHER, "labels": {}}})
    selections = Selections(kube, bus, retry_delay=0.1)
    following = asyncio.create_task(selections.run())
    try:
        await wait_requested(bus, [(NODE, "all-balanced")])  # OTHER has none: nothing

        await nodes.set_labels(kube, NODE, {MIG_CONFIG_LABEL: "all-1g.18gb"})
        await nodes.set_labels(kube, NODE, {CONFIG_LABEL: "shared"})  # the plugin's, not MIG
        await nodes.set_labels(kube, OTHER, {MIG_CONFIG_LABEL: "all-disabled"})
        await nodes.set_labels(kube, NODE, {MIG_CONFIG_LABEL: None})
        await wait_requested(
            bus,
            [
                (NODE, "all-balanced"),
                (NODE, "all-1g.18gb"),
                (OTHER, "all-disabled"),
                (NODE, None),
            ],
        )
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
    assert selections.published_for(MIG_CONFIG_LABEL) == {NODE: None, OTHER: "all-disabled"}
    assert selections.published == {NODE: "shared"}, "the plugin's label is told on its own"


async def test_a_restarted_cluster_role_requests_only_what_changed_meanwhile(
    server: ApiServer, kube: client.Kube, bus: InMemoryBus
) -> None:
    source = "/gpuop/discovery-labeler"
    earlier = mig_requests.MigConfigRequested(config="all-balanced")
    await bus.publish(new_event(earlier, node=NODE, source=source))
    await bus.publish(new_event(earlier, node=OTHER, source=source))
    server.seed(node_object(labels={MIG_CONFIG_LABEL: "all-balanced"}))  # unchanged
    other = {"name": OTHER, "labels": {MIG_CONFIG_LABEL: "all-disabled"}}  # changed meanwhile
    server.seed({**node_object(), "metadata": other})

    selections = Selections(kube, bus, retry_delay=0.1)
    await selections.restore()
    following = asyncio.create_task(selections.run())
    try:
        await wait_requested(
            bus, [(NODE, "all-balanced"), (OTHER, "all-balanced"), (OTHER, "all-disabled")]
        )
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)


async def test_a_label_value_no_event_can_carry_is_skipped_not_retried(
    kube: client.Kube, bus: InMemoryBus
) -> None:
    selections = Selections(kube, bus, retry_delay=0.1)
    bad = node_object(labels={MIG_CONFIG_LABEL: "x" * 80})  # no API server stores that
    await selections.observe(NODE, bad)
    assert await requested(bus) == []
    assert selections.published_for(MIG_CONFIG_LABEL) == {}
