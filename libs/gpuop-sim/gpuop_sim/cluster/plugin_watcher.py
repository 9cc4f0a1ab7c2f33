"""The kubelet's plugin watcher, simulated: DRA kubelet plugins register through sockets in
`<kubelet dir>/plugins_registry`, as with the real kubelet (pkg/kubelet/pluginmanager).

The watcher polls the directory every `interval` seconds (the real one uses inotify):

    a new socket (a name not starting with `.`)
                   dial it, GetInfo; a `DRAPlugin` whose supported versions include
                   `v1.DRAPlugin` is registered and told NotifyRegistrationStatus(True);
                   any other answer is told registered=False with the reason
    a socket gone  its plugin is unregistered
    a failed dial  tried again at the next poll

    watcher = PluginWatcher(host_root / "var/lib/kubelet/plugins_registry")
    await watcher.start()
    await watcher.wait_for("gpu.nvidia.com")
    ...
    await watcher.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpuop.kubelet.pluginregistration.v1 import api_pb2, api_pb2_grpc
from gpuop.kubelet.sockets import UnixTarget

log = logging.getLogger(__name__)

PLUGINS_REGISTRY = "plugins_registry"
"""The kubelet's registration directory, in its root directory."""
DRA_PLUGIN = "DRAPlugin"
DRA_VERSION = "v1.DRAPlugin"
"""The DRAPlugin service version this kubelet speaks."""
POLL_INTERVAL = 0.5
DIAL_TIMEOUT = 10.0


@dataclass(frozen=True)
class RegisteredPlugin:
    """A DRA plugin the kubelet accepted."""

    socket: Path
    info: api_pb2.PluginInfo


def registration_problem(info: api_pb2.PluginInfo) -> str | None:
    """Why the kubelet refuses a plugin's GetInfo answer; None when it accepts it."""
    if info.type != DRA_PLUGIN:
        return f"unsupported plugin type {info.type!r}: only {DRA_PLUGIN} is handled"
    if not info.name:
        return "the plugin has no name"
    if DRA_VERSION not in info.supported_versions:
        versions = ", ".join(info.supported_versions) or "none"
        return f"none of the plugin's versions ({versions}) is supported: {DRA_VERSION}"
    if not info.endpoint:
        return "the plugin has no endpoint"
    return None


class PluginWatcher:
    """Registers the DRA plugins whose sockets appear in `directory`."""

    def __init__(self, directory: Path, *, interval: float = POLL_INTERVAL) -> None:
        self.directory = directory
        self.interval = interval
        self.plugins: dict[str, RegisteredPlugin] = {}
        """Registered plugins by name."""
        self.refused: dict[Path, str] = {}
        """Sockets whose plugin was refused, with the reason told to it."""
        self._seen: set[Path] = set()
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await asyncio.to_thread(self.directory.mkdir, parents=True, exist_ok=True)
        self._task = asyncio.create_task(self._watch(), name=f"plugin-watcher-{self.directory}")

    async def stop(self) -> None:
        """Stop watching; registrations are forgotten, as by a kubelet that goes away."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self._seen.clear()
        self.plugins.clear()
        self.refused.clear()

    async def wait_for(self, name: str, *, timeout: float = 10.0) -> RegisteredPlugin:
        """The plugin `name` once registered; `TimeoutError` when not within `timeout`."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: name in self.plugins)
            return self.plugins[name]

    async def wait_for_refusal(self, socket: Path, *, timeout: float = 10.0) -> str:
        """The reason the plugin at `socket` was refused, once it was."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: socket in self.refused)
            return self.refused[socket]

    async def _watch(self) -> None:
        while True:
            await self.poll()
            await asyncio.sleep(self.interval)

    async def poll(self) -> None:
        """One look at the directory: register new sockets, unregister removed ones."""
        present = await asyncio.to_thread(self._sockets)
        for socket in self._seen - present:
            self._seen.discard(socket)
            await self._unregister(socket)
        for socket in sorted(present - self._seen):
            try:
                await self._register(socket)
            except (grpc.aio.AioRpcError, OSError) as error:
                log.info("cannot register the plugin at %s yet: %s", socket, error)
                continue
            self._seen.add(socket)

    def _sockets(self) -> set[Path]:
        return {p for p in self.directory.iterdir() if not p.name.startswith(".") and p.is_socket()}

    async def _register(self, socket: Path) -> None:
        target = UnixTarget(socket)
        channel = grpc.aio.insecure_channel(target.address)
        try:
            stub = api_pb2_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(api_pb2.InfoRequest(), timeout=DIAL_TIMEOUT)
            problem = registration_problem(info)
            await stub.NotifyRegistrationStatus(
                api_pb2.RegistrationStatus(plugin_registered=problem is None, error=problem or ""),
                timeout=DIAL_TIMEOUT,
            )
        finally:
            await channel.close(None)
            target.close()
        async with self._changed:
            if problem is None:
                self.plugins[info.name] = RegisteredPlugin(socket, info)
                log.info("registered DRA plugin %s at %s", info.name, info.endpoint)
            else:
                self.refused[socket] = problem
                log.info("refused the plugin at %s: %s", socket, problem)
            self._changed.notify_all()

    async def _unregister(self, socket: Path) -> None:
        async with self._changed:
            self.refused.pop(socket, None)
            for name, plugin in list(self.plugins.items()):
                if plugin.socket == socket:
                    del self.plugins[name]
                    log.info("unregistered DRA plugin %s", name)
            self._changed.notify_all()

    async def __aenter__(self) -> PluginWatcher:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self.stop()
