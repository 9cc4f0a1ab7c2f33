"""A node's device plugin config, selected and reported, on the shipped NATS configuration
with each service's own user: discovery's cluster role tells the node's plugin what the
label selects and reads back what the plugins run; the plugin (the real agent, serving the
simulated kubelet) reads its last selection at start, consumes the next, and reports the
config in force. Nothing may be refused."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import pytest

from gpuop.bus import Delivery, NatsBus
from gpuop.events import device
from gpuop.kube import client
from gpuop.services.device_plugin.config import load_configs
from gpuop.services.discovery import consumers, labeler
from gpuop.services.discovery.selections import CONFIG_LABEL, Selections
from tests.integration.deploy.ownership import NODE, PREFIX
from tests.support.kubelet_plugin import GPU, build_host, healthy, running_node
from tests.support.shipped_nats import ShippedNats

pytestmark = pytest.mark.nats

NAMED = """\
default: a
configs:
  a: {}
  b: {sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}}
"""


def node(label: str | None) -> dict[str, object]:
    labels = {} if label is None else {CONFIG_LABEL: label}
    return {"metadata": {"name": NODE, "labels": labels}}


async def test_the_label_reaches_the_plugin_and_its_config_the_labeler(
    server: ShippedNats, tmp_path: Path
) -> None:
    assert NODE == "gpu-1.example.com"  # the simulated node's name
    path = tmp_path / "device-plugin.yaml"
    path.write_text(NAMED)
    host = build_host(tmp_path / "host", 2)
    cluster: NatsBus = server.bus("discovery-cluster", publish_timeout=2.0, retry_for=2.0)
    plugin: NatsBus = server.bus("device-plugin", publish_timeout=2.0, retry_for=2.0)
    reports: asyncio.Queue[device.DevicePluginConfigApplied] = asyncio.Queue()

    async def labelled(delivery: Delivery) -> None:
        if isinstance(delivery.payload, device.DevicePluginConfigApplied):
            await reports.put(delivery.payload)

    try:
        await cluster.start()
        await plugin.start()
        # the cluster role's Node watch is not needed here: `observe` is what it calls
        selections = Selections(cast(client.Kube, None), cluster)
        await selections.restore()
        assert await selections.observe(NODE, node("b"))
        subscription = await cluster.consume(consumers.labeler(PREFIX, retry_delay=0.1), labelled)
        async with running_node(
            host, gpus=2, config=load_configs(path), reload=lambda: load_configs(path), bus=plugin
        ) as running:
            await running.kubelet.wait_for_devices(GPU, healthy(8))  # b, read at start
            first = await asyncio.wait_for(reports.get(), 10.0)
            assert (first.config, first.replicas) == ("b", 4)

            assert await selections.observe(NODE, node(None))
            await running.kubelet.wait_for_devices(GPU, healthy(2))  # a, consumed live
            second = await asyncio.wait_for(reports.get(), 10.0)
            assert (second.config, second.outcome) == ("a", "default")
        await subscription.stop()

        assert (await labeler.plugin_configs(cluster))[NODE].config == "a"
        again = Selections(cast(client.Kube, None), cluster)
        await again.restore()
        assert again.published == {NODE: None}
    finally:
        await plugin.close()
        await cluster.close()
    await server.stop()  # flushes the trace

    assert [
        v for v in server.violations() if v.user in ("discovery-cluster", "device-plugin")
    ] == []
