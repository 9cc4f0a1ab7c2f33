"""Which kubelet API the node's GPUs are served through, kept on the host across restarts,
and what the switch reports when the DRA plugin cannot start."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from gpuop.events.device_api_commands import DeviceApi
from gpuop.host.roots import HostRoot
from gpuop.services.device_plugin.config import DevicePluginConfig
from gpuop.services.device_plugin.dra import deviceapis
from gpuop.services.device_plugin.dra.plugin import DraPlugin, data_dir
from gpuop.services.device_plugin.dra.switching import DeviceApiSwitch
from gpuop.services.device_plugin.metrics import PluginMetrics
from gpuop.services.device_plugin.plugins import DevicePlugins
from tests.support.device_plugin import sim_nvml


def test_no_choice_is_the_device_plugin_and_a_choice_is_kept(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    assert deviceapis.load(root) is DeviceApi.DEVICE_PLUGIN
    deviceapis.save(root, DeviceApi.DRA)
    assert deviceapis.load(root) is DeviceApi.DRA


def test_a_file_naming_no_api_is_read_as_the_default(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    root.join(deviceapis.FILE).parent.mkdir(parents=True)
    root.join(deviceapis.FILE).write_text("both\n")
    assert deviceapis.load(root) is DeviceApi.DEVICE_PLUGIN


def switch_on(root: HostRoot) -> tuple[DeviceApiSwitch, DevicePlugins]:
    plugins = DevicePlugins(
        root, sim_nvml(2), DevicePluginConfig(), PluginMetrics(CollectorRegistry())
    )
    dra = DraPlugin(root, "node-a", lambda: plugins.gpu_inventory, plugins.health)
    return DeviceApiSwitch(plugins, dra, register_wait=0.01), plugins


async def test_a_node_that_chose_dra_starts_without_advertising_gpus(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    deviceapis.save(root, DeviceApi.DRA)
    switch, plugins = switch_on(root)
    assert switch.api is DeviceApi.DRA
    assert plugins.advertise_gpus is False


async def test_an_unreadable_checkpoint_is_reported_not_serving(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    checkpoint = root.join(f"{data_dir()}/checkpoint.json")
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_text("{")
    switch, plugins = switch_on(root)
    answer = await switch.apply(DeviceApi.DRA)
    assert (answer.api, answer.serving) == (DeviceApi.DRA, False)
    assert "checkpoint.json" in answer.message
    assert plugins.advertise_gpus is False
    assert deviceapis.load(root) is DeviceApi.DRA
