"""Named device plugin configs switched at run time, through the real gRPC path: the
simulated kubelet on real unix sockets, the plugin fed from the in-memory bus the way
discovery's cluster role feeds it (`device.plugin-config-selected` when the Node's label
changes). One process and one socket throughout: the kubelet sees the new device list on
the ListAndWatch stream it has open, with no new registration."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from gpuop.bus import InMemoryBus
from gpuop.events import device, new_event
from gpuop.host.roots import HostRoot
from gpuop.services.device_plugin.config import PluginConfigs, load_configs
from gpuop.services.device_plugin.plugins import Reload
from gpuop.services.device_plugin.serving import identity, socket_name
from tests.support.kubelet_plugin import GPU, NODE, Node, build_host, healthy, running_node

NAMED = """\
default: a
configs:
  a: {}
  b:
    sharing:
      timeSlicing:
        resources: [{name: nvidia.com/gpu, replicas: 4}]
  c:
    sharing:
      timeSlicing:
        renameByDefault: true
        resources: [{name: nvidia.com/gpu, replicas: 2}]
"""
BROKEN_B = NAMED.replace("replicas: 4", "replicas: 0")
SHARED = "nvidia.com/gpu.shared"


@pytest.fixture
def host(tmp_path: Path) -> HostRoot:
    return build_host(tmp_path / "host", 4)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "device-plugin.yaml"
    path.write_text(NAMED)
    return path


def from_file(path: Path) -> tuple[PluginConfigs, Reload]:
    """The configs as `main` reads them, and the plugin's re-read of the same file."""
    return load_configs(path), lambda: load_configs(path)


async def select(node: Node, label: str | None) -> None:
    """The node's `nvidia.com/device-plugin.config` label is now `label`, as discovery's
    cluster role reports it."""
    await node.publish(device.DevicePluginConfigSelected(config=label))


async def applied(node: Node, count: int) -> device.DevicePluginConfigApplied:
    """The `count`-th config report of the node."""
    return (await node.confirmations(device.DevicePluginConfigApplied, count))[count - 1]


async def test_a_label_switch_re_advertises_on_the_same_socket_and_back(
    host: HostRoot, config_file: Path
) -> None:
    configs, reload = from_file(config_file)
    async with running_node(host, gpus=4, config=configs, reload=reload) as node:
        whole = await node.kubelet.wait_for_devices(GPU, healthy(4))
        first = await applied(node, 1)
        assert (first.config, first.outcome, first.replicas) == ("a", "default", 1)
        socket = node.kubelet.device_plugin_dir / socket_name(GPU)
        served = identity(socket)
        before = await node.kubelet.allocate(GPU, [whole[0].ID], pod="before-the-switch")
        assert before.envs["NVIDIA_VISIBLE_DEVICES"] == whole[0].ID

        await select(node, "b")
        replicas = await node.kubelet.wait_for_devices(GPU, healthy(16))
        assert [d.ID for d in replicas] == [f"{d.ID}::{n}" for d in whole for n in range(4)]
        assert len(node.kubelet.registrations) == 1, "no re-registration"
        assert identity(socket) == served, "the same socket, the same process"
        report = await applied(node, 2)
        assert (report.config, report.requested, report.outcome) == ("b", "b", "selected")
        assert (report.replicas, report.sharing_strategy, report.renamed) == (
            4,
            "time-slicing",
            False,
        )
        # new Allocate calls use the new config: a replica id is known, a whole-GPU id not
        answer = await node.kubelet.allocate(GPU, [replicas[5].ID], pod="after-the-switch")
        assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == whole[1].ID
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await node.kubelet.allocate(GPU, [whole[2].ID], pod="old-id")
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert node.plugins.selection.name == "b"

        await select(node, None)  # the label removed: the default again
        again = await node.kubelet.wait_for_devices(GPU, healthy(4))
        assert [d.ID for d in again] == [d.ID for d in whole]
        assert len(node.kubelet.registrations) == 1
        assert (await applied(node, 3)).outcome == "default"
        # what the kubelet allocated before and during the switches stays allocated
        assert [a.pod for a in node.kubelet.allocations] == [
            "before-the-switch",
            "after-the-switch",
        ]


async def test_a_renamed_resource_gets_its_own_server_and_registration(
    host: HostRoot, config_file: Path
) -> None:
    configs, reload = from_file(config_file)
    async with running_node(host, gpus=4, config=configs, reload=reload) as node:
        whole = await node.kubelet.wait_for_devices(GPU, healthy(4))
        await applied(node, 1)

        await select(node, "c")
        shared = await node.kubelet.wait_for_devices(SHARED, healthy(8))
        assert {d.ID.split("::")[0] for d in shared} == {d.ID for d in whole}
        await node.kubelet.wait_for_devices(GPU, lambda devices: devices == ())
        assert [r.resource_name for r in node.kubelet.registrations] == [GPU, SHARED]
        report = await applied(node, 2)
        assert (report.replicas, report.renamed) == (2, True)

        await select(node, "a")
        await node.kubelet.wait_for_devices(GPU, healthy(4))
        await node.kubelet.wait_for_devices(SHARED, lambda devices: devices == ())


async def test_a_label_naming_no_config_runs_the_default_and_says_so(
    host: HostRoot, config_file: Path
) -> None:
    configs, reload = from_file(config_file)
    registry = CollectorRegistry()
    async with running_node(host, gpus=4, config=configs, reload=reload, registry=registry) as node:
        await applied(node, 1)  # the start's report, before any label
        await select(node, "b")
        await node.kubelet.wait_for_devices(GPU, healthy(16))

        await select(node, "tesla-t4")
        await node.kubelet.wait_for_devices(GPU, healthy(4))
        report = await applied(node, 3)
        assert (report.config, report.requested, report.outcome) == ("a", "tesla-t4", "unknown")
        assert "names no config (there are a, b, c)" in report.message
        assert (
            registry.get_sample_value(
                "gpuop_device_plugin_config_selections_total", {"outcome": "unknown"}
            )
            == 1
        )
        assert registry.get_sample_value("gpuop_device_plugin_config", {"config": "a"}) == 1
        assert registry.get_sample_value("gpuop_device_plugin_config", {"config": "b"}) is None


async def test_a_switch_to_a_config_that_no_longer_validates_is_refused_and_the_old_stays(
    host: HostRoot, config_file: Path
) -> None:
    configs, reload = from_file(config_file)
    async with running_node(host, gpus=4, config=configs, reload=reload) as node:
        await applied(node, 1)
        await select(node, "c")
        await node.kubelet.wait_for_devices(SHARED, healthy(8))
        await applied(node, 2)
        await asyncio.to_thread(config_file.write_text, BROKEN_B)  # the ConfigMap, edited wrongly

        await select(node, "b")
        report = await applied(node, 3)
        assert (report.config, report.requested, report.outcome) == ("c", "b", "refused")
        assert "configs.b.sharing.timeSlicing.resources.0.replicas" in report.message
        assert node.plugins.selection.name == "c"
        assert len(node.kubelet.devices(SHARED)) == 8
        assert node.kubelet.devices(GPU) == ()

        await asyncio.to_thread(config_file.write_text, NAMED)  # fixed: the next switch takes it
        await select(node, "b")
        await node.kubelet.wait_for_devices(GPU, healthy(16))
        assert (await applied(node, 4)).outcome == "selected"


async def test_a_restarted_plugin_starts_on_the_config_its_label_last_selected(
    host: HostRoot, config_file: Path
) -> None:
    bus = InMemoryBus()
    await bus.start()
    try:
        selected = device.DevicePluginConfigSelected(config="b")
        await bus.publish(new_event(selected, node=NODE, source="/gpuop/discovery-labeler"))
        configs, reload = from_file(config_file)
        async with running_node(host, gpus=4, config=configs, reload=reload, bus=bus) as node:
            await node.kubelet.wait_for_devices(GPU, healthy(16))
            report = await applied(node, 1)
            assert (report.config, report.outcome) == ("b", "selected")
            assert len(node.kubelet.registrations) == 1

            await select(node, "a")
            await node.kubelet.wait_for_devices(GPU, healthy(4))
            # the live consumer reads from the start of the stream: it came to the selection
            # read at start before this one, and skipped it
            reports = await node.confirmations(device.DevicePluginConfigApplied, 2)
            assert [r.config for r in reports] == ["b", "a"]
    finally:
        await bus.close()
