"""The simulated kubelet registers DRA plugins through `plugins_registry` as the real one
does: GetInfo, then NotifyRegistrationStatus; a wrong answer is refused with its reason, a
removed socket unregisters, a hidden file is ignored."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest

from gpuop.kubelet.pluginregistration.v1 import api_pb2, api_pb2_grpc
from gpuop.kubelet.sockets import serve
from gpuop_sim.cluster.kubelet_grpc import KubeletGrpc
from gpuop_sim.cluster.plugin_watcher import PLUGINS_REGISTRY, PluginWatcher


class FakePlugin(api_pb2_grpc.RegistrationServicer):
    def __init__(self, info: api_pb2.PluginInfo) -> None:
        self.info = info
        self.asked = 0
        self.statuses: list[api_pb2.RegistrationStatus] = []

    async def GetInfo(
        self, request: api_pb2.InfoRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PluginInfo:
        self.asked += 1
        return self.info

    async def NotifyRegistrationStatus(
        self, request: api_pb2.RegistrationStatus, context: grpc.aio.ServicerContext
    ) -> api_pb2.RegistrationStatusResponse:
        self.statuses.append(request)
        return api_pb2.RegistrationStatusResponse()


def info(**fields: object) -> api_pb2.PluginInfo:
    defaults: dict[str, object] = {
        "type": "DRAPlugin",
        "name": "gpu.nvidia.com",
        "endpoint": "/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock",
        "supported_versions": ["v1.DRAPlugin", "v1beta1.DRAPlugin"],
    }
    return api_pb2.PluginInfo(**(defaults | fields))  # type: ignore[arg-type]


@asynccontextmanager
async def serving(socket: Path, plugin: FakePlugin) -> AsyncIterator[None]:
    server = grpc.aio.server()
    api_pb2_grpc.add_RegistrationServicer_to_server(plugin, server)
    target = await serve(server, socket)
    try:
        yield
    finally:
        await server.stop(None)
        target.close()
        await asyncio.to_thread(socket.unlink, missing_ok=True)


@pytest.fixture
async def watcher(tmp_path: Path) -> AsyncIterator[PluginWatcher]:
    async with PluginWatcher(tmp_path / PLUGINS_REGISTRY, interval=0.05) as running:
        yield running


async def test_a_dra_plugin_is_registered_and_told_so(watcher: PluginWatcher) -> None:
    plugin = FakePlugin(info())
    socket = watcher.directory / "gpu.nvidia.com-reg.sock"
    async with serving(socket, plugin):
        registered = await watcher.wait_for("gpu.nvidia.com")
        assert registered.socket == socket
        assert [(s.plugin_registered, s.error) for s in plugin.statuses] == [(True, "")]
    await watcher.poll()
    assert watcher.plugins == {}


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"type": "CSIPlugin"}, "unsupported plugin type"),
        ({"supported_versions": ["v1beta1.DRAPlugin"]}, "v1.DRAPlugin"),
        ({"endpoint": ""}, "no endpoint"),
    ],
)
async def test_a_wrong_answer_is_refused_with_its_reason(
    watcher: PluginWatcher, fields: dict[str, object], words: str
) -> None:
    plugin = FakePlugin(info(**fields))
    socket = watcher.directory / "other-reg.sock"
    async with serving(socket, plugin):
        reason = await watcher.wait_for_refusal(socket)
    assert words in reason
    assert [(s.plugin_registered, s.error) for s in plugin.statuses] == [(False, reason)]
    assert watcher.plugins == {}


async def test_hidden_sockets_are_ignored(watcher: PluginWatcher) -> None:
    plugin = FakePlugin(info())
    async with serving(watcher.directory / ".hidden.sock", plugin):
        await watcher.poll()
    assert (plugin.asked, plugin.statuses) == (0, [])
    assert watcher.plugins == {}


async def test_the_kubelet_watches_its_plugins_registry(tmp_path: Path) -> None:
    plugin = FakePlugin(info())
    async with KubeletGrpc.under(tmp_path) as kubelet:
        directory = tmp_path / "var/lib/kubelet" / PLUGINS_REGISTRY
        assert kubelet.plugin_watcher.directory == directory
        async with serving(directory / "gpu.nvidia.com-reg.sock", plugin):
            await kubelet.plugin_watcher.wait_for("gpu.nvidia.com")
    assert [s.plugin_registered for s in plugin.statuses] == [True]
