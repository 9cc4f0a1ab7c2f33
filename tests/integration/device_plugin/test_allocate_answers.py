"""Allocate answers the plugin keeps, through the real gRPC path: the simulated kubelet asks
the same ids again after a config switch, a health event and a driver reload, and gets what
the plugin would answer fresh each time."""

from __future__ import annotations

from pathlib import Path

from gpuop.events import device
from gpuop.services.device_plugin import cdi
from gpuop.services.device_plugin.config import load_configs
from tests.support.kubelet_plugin import GPU, build_host, healthy, running_node, unhealthy

NAMED = """\
default: envvar
configs:
  envvar: {}
  cdi:
    flags:
      plugin: {deviceListStrategy: [cdi], passDeviceSpecs: true}
"""


async def test_a_config_switch_changes_the_answer_for_the_same_ids(tmp_path: Path) -> None:
    host = build_host(tmp_path / "host", 2)
    path = tmp_path / "device-plugin.yaml"
    path.write_text(NAMED)
    configs, reload = load_configs(path), lambda: load_configs(path)
    async with running_node(host, gpus=2, config=configs, reload=reload) as node:
        gpu = (await node.kubelet.wait_for_devices(GPU, healthy(2)))[0].ID
        for pod in ("first", "again"):
            answer = await node.kubelet.allocate(GPU, [gpu], pod=pod)
            assert (dict(answer.envs), list(answer.cdi_devices)) == (
                {"NVIDIA_VISIBLE_DEVICES": gpu},
                [],
            )

        await node.publish(device.DevicePluginConfigSelected(config="cdi"))
        await node.confirmations(device.DevicePluginConfigApplied, 2)
        answer = await node.kubelet.allocate(GPU, [gpu], pod="under-cdi")
        assert dict(answer.envs) == {}
        assert [d.name for d in answer.cdi_devices] == [f"{cdi.KIND}={gpu}"]
        assert answer.devices, "passDeviceSpecs: the device nodes too"

        await node.publish(device.DevicePluginConfigSelected(config=None))
        await node.confirmations(device.DevicePluginConfigApplied, 3)
        answer = await node.kubelet.allocate(GPU, [gpu], pod="back")
        assert (dict(answer.envs), list(answer.devices)) == ({"NVIDIA_VISIBLE_DEVICES": gpu}, [])


async def test_health_and_a_driver_reload_leave_the_answer_as_it_was(tmp_path: Path) -> None:
    host = build_host(tmp_path / "host", 2)
    async with running_node(host, gpus=2) as node:
        sick, other = (d.ID for d in await node.kubelet.wait_for_devices(GPU, healthy(2)))
        before = [await node.kubelet.allocate(GPU, [gpu], pod=gpu) for gpu in (sick, other)]

        await node.xid(sick, 79)
        await node.kubelet.wait_for_devices(GPU, unhealthy(sick))
        assert [await node.kubelet.allocate(GPU, [gpu], pod=gpu) for gpu in (sick, other)] == before

        await node.validated()
        await node.kubelet.wait_for_devices(GPU, healthy(2))
        assert [await node.kubelet.allocate(GPU, [gpu], pod=gpu) for gpu in (sick, other)] == before
