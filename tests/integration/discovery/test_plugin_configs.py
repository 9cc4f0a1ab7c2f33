"""Per-node device plugin configs through discovery's cluster role, against the simulated
API server: the Node's `nvidia.com/device-plugin.config` label becomes a
`device.plugin-config-selected` for that node's plugin, and the plugin's
`device.plugin-config-applied` becomes the node's sharing labels."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gpuop.bus import Buckets, InMemoryBus, KeyValue, PublishAck, TemporaryError
from gpuop.bus.errors import BusUnavailable
from gpuop.events import Envelope, decode, device, new_event, subjects
from gpuop.inventory.labeling import LabelSettings
from gpuop.kube import client, nodes
from gpuop.services.discovery import labeler
from gpuop.services.discovery.labeler import Labeler
from gpuop.services.discovery.selections import CONFIG_LABEL, Selections, selections_filter
from gpuop_sim import ApiServer
from tests.support.discovered import NODE, inventory, labels_on, node_object

OTHER = "gpu-2.example.com"
SHARING = ("nvidia.com/gpu.replicas", "nvidia.com/gpu.sharing-strategy", "nvidia.com/gpu.product")


class FlakyBus(InMemoryBus):
    """An in-memory bus that refuses publishes while `down`."""

    down = False

    async def publish(self, envelope: Envelope) -> PublishAck:
        if self.down:
            raise BusUnavailable("NATS does not answer")
        return await super().publish(envelope)


@pytest.fixture
async def bus() -> AsyncIterator[InMemoryBus]:
    running = InMemoryBus()
    await running.start()
    yield running
    await running.close()


@pytest.fixture
async def inventories(bus: InMemoryBus) -> KeyValue:
    return await bus.kv(Buckets.NODES)


async def selected(bus: InMemoryBus) -> list[tuple[str, str | None]]:
    """Every selection published: (node, label value)."""
    found = []
    async for message in bus.read(selections_filter(bus.prefix)):
        envelope, payload = decode(message.data)
        assert isinstance(payload, device.DevicePluginConfigSelected)
        found.append((envelope.node, payload.config))
    return found


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    async with asyncio.timeout(10):
        while not await check():
            await asyncio.sleep(0.02)


async def wait_selected(bus: InMemoryBus, expected: list[tuple[str, str | None]]) -> None:
    async def done() -> bool:
        return await selected(bus) == expected

    await eventually(done, f"selections {expected}")


def applied(
    replicas: int, *, renamed: bool = False, outcome: device.ConfigOutcome | None = None
) -> device.DevicePluginConfigApplied:
    shared = replicas > 1
    return device.DevicePluginConfigApplied(
        config="shared" if shared else "exclusive",
        requested="shared" if shared else None,
        outcome=outcome
        or (device.ConfigOutcome.SELECTED if shared else device.ConfigOutcome.DEFAULT),
        replicas=replicas,
        sharing_strategy=device.SharingStrategy.TIME_SLICING
        if shared
        else device.SharingStrategy.NONE,
        renamed=renamed,
    )


async def test_each_change_of_a_nodes_label_is_told_to_its_plugin(
    server: ApiServer, kube: client.Kube, bus: InMemoryBus
) -> None:
    server.seed(node_object(labels={CONFIG_LABEL: "shared"}))
    server.seed({**node_object(), "metadata": {"name": OTHER, "labels": {}}})
    selections = Selections(kube, bus, retry_delay=0.1)
    following = asyncio.create_task(selections.run())
    try:
        await wait_selected(bus, [(NODE, "shared")])  # the other node has no label: nothing

        await nodes.set_labels(kube, NODE, {CONFIG_LABEL: "exclusive"})
        await wait_selected(bus, [(NODE, "shared"), (NODE, "exclusive")])
        await nodes.set_labels(kube, NODE, {"team": "ml"})  # another label: nothing to tell
        await nodes.set_labels(kube, OTHER, {CONFIG_LABEL: "shared"})
        await nodes.set_labels(kube, NODE, {CONFIG_LABEL: None})  # removed: the default
        await wait_selected(
            bus, [(NODE, "shared"), (NODE, "exclusive"), (OTHER, "shared"), (NODE, None)]
        )
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
    assert selections.published == {NODE: None, OTHER: "shared"}


async def test_a_restarted_cluster_role_tells_only_what_changed_meanwhile(
    server: ApiServer, kube: client.Kube, bus: InMemoryBus
) -> None:
    earlier = device.DevicePluginConfigSelected(config="shared")
    await bus.publish(new_event(earlier, node=NODE, source="/gpuop/discovery-labeler"))
    gone = device.DevicePluginConfigSelected(config="shared")
    await bus.publish(new_event(gone, node=OTHER, source="/gpuop/discovery-labeler"))
    server.seed(node_object(labels={CONFIG_LABEL: "shared"}))  # unchanged
    server.seed({**node_object(), "metadata": {"name": OTHER, "labels": {}}})  # label removed

    selections = Selections(kube, bus, retry_delay=0.1)
    await selections.restore()
    following = asyncio.create_task(selections.run())
    try:
        await wait_selected(bus, [(NODE, "shared"), (OTHER, "shared"), (OTHER, None)])
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)


async def test_a_selection_the_bus_refuses_is_told_with_the_next_node_change(
    server: ApiServer, kube: client.Kube
) -> None:
    bus = FlakyBus()
    await bus.start()
    selections = Selections(kube, bus, retry_delay=0.1)
    bus.down = True
    with pytest.raises(BusUnavailable):
        await selections.observe(NODE, node_object(labels={CONFIG_LABEL: "shared"}))
    assert selections.published == {}
    bus.down = False

    server.seed({**node_object(), "metadata": {"name": OTHER, "labels": {}}})
    following = asyncio.create_task(selections.run())  # OTHER's first sight sends NODE's
    try:
        await wait_selected(bus, [(NODE, "shared")])
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
        await bus.close()


async def test_the_plugins_report_relabels_the_node_from_its_stored_inventory(
    server: ApiServer, kube: client.Kube, inventories: KeyValue
) -> None:
    server.seed(node_object())
    stored = inventory(gpus=8)
    await inventories.put(subjects.encode_node(NODE), stored.model_dump_json().encode())
    subject = Labeler(kube, inventories, LabelSettings(), retry_delay=0.1)
    await subject.apply(NODE, stored)
    assert [(await labels_on(kube))[k] for k in SHARING] == ["1", "none", "NVIDIA-H200"]

    await subject.plugin_config(NODE, applied(4))
    assert [(await labels_on(kube))[k] for k in SHARING] == [
        "4",
        "time-slicing",
        "NVIDIA-H200-SHARED",
    ]
    await subject.plugin_config(NODE, applied(2, renamed=True))
    assert [(await labels_on(kube))[k] for k in SHARING] == ["2", "time-slicing", "NVIDIA-H200"]

    await subject.apply(NODE, inventory(gpus=4))  # a new inventory keeps the node's sharing
    labels = await labels_on(kube)
    assert (labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.replicas"]) == ("4", "2")

    await subject.plugin_config(NODE, applied(1))
    assert [(await labels_on(kube))[k] for k in SHARING] == ["1", "none", "NVIDIA-H200"]


async def test_a_report_before_any_inventory_waits_for_the_first_one(
    server: ApiServer, kube: client.Kube, inventories: KeyValue
) -> None:
    server.seed(node_object())
    subject = Labeler(kube, inventories, LabelSettings(), retry_delay=0.1)

    await subject.plugin_config(NODE, applied(4, outcome=device.ConfigOutcome.UNKNOWN))
    assert "nvidia.com/gpu.replicas" not in await labels_on(kube)
    await subject.apply(NODE, inventory(gpus=8))
    assert (await labels_on(kube))["nvidia.com/gpu.replicas"] == "4"


async def test_a_restarted_labeler_learns_each_nodes_config_from_the_log(
    server: ApiServer, kube: client.Kube, bus: InMemoryBus, inventories: KeyValue
) -> None:
    server.seed(node_object())
    for report in (applied(4), applied(8)):
        await bus.publish(new_event(report, node=NODE, source="/gpuop/device-plugin/test"))

    known = await labeler.plugin_configs(bus)
    subject = Labeler(kube, inventories, LabelSettings(replicas=2), plugin_configs=known)
    await subject.apply(NODE, inventory(gpus=8))

    assert known[NODE].replicas == 8
    assert (await labels_on(kube))["nvidia.com/gpu.replicas"] == "8"
    assert subject.settings_for(OTHER) == LabelSettings(replicas=2), "discovery's own config"


async def test_a_report_whose_relabelling_failed_relabels_when_delivered_again(
    server: ApiServer, kube: client.Kube, inventories: KeyValue
) -> None:
    stored = inventory(gpus=8)
    await inventories.put(subjects.encode_node(NODE), stored.model_dump_json().encode())
    subject = Labeler(kube, inventories, LabelSettings(), retry_delay=0.1)
    with pytest.raises(TemporaryError, match="not registered"):
        await subject.plugin_config(NODE, applied(4))  # the Node is not there yet

    server.seed(node_object())
    await subject.plugin_config(NODE, applied(4))  # the consumer's redelivery
    assert (await labels_on(kube))["nvidia.com/gpu.replicas"] == "4"
    before = len(server.request_log)
    await subject.plugin_config(NODE, applied(4))  # the same sharing again: nothing to do
    assert len(server.request_log) == before
