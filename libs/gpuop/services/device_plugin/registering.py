"""Keeps every plugin server registered with the kubelet, across kubelet restarts.

`Registrar.run` looks at the device-plugin directory whenever an inotify watch on it
(`gpuop.host.inotify`) tells of a change, and acts on what it finds:

    no kubelet.sock                 the kubelet is gone: wait; keep serving, keep the
                                    devices' last known health
    a new kubelet.sock              a kubelet (re)started: register every server again,
                                    but one whose registration this kubelet took already
    a server's socket deleted       the kubelet's startup cleanup: serve it again on a new
                                    socket, then register it
    a server not registered yet     register it (serve first, then register, always)

A new server needs no wake-up of its own: it binds its socket in the same directory. The
watch is what upstream's plugin uses too (issue 24: looking five times a second was most of
an idle device plugin's CPU); with it an idle node costs one look every `safety_interval`
(10 s), a net for whatever the watch might not tell. Where no watch can be set (inotify
refused, the directory not there yet, the watched directory deleted) the registrar looks
every `poll_interval` (0.2 s: a restarted kubelet sees the plugins again well within 2 s)
and tries to set the watch at each look; it also polls while a registration waits for its
retry, so `retry_interval` holds.

A registration the kubelet refuses or does not answer within `timeout` is retried after
`retry_interval`, never fatal: unlike upstream, the process stays up and keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

import grpc

from gpuop.host import inotify
from gpuop.kubelet import constants
from gpuop.kubelet.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from gpuop.kubelet.sockets import UnixTarget
from gpuop.runtime import waiting
from gpuop.services.device_plugin.errors import RegistrationFailed
from gpuop.services.device_plugin.metrics import PluginMetrics
from gpuop.services.device_plugin.serving import PluginServer, SocketIdentity, identity

log = logging.getLogger(__name__)

POLL_INTERVAL = 0.2
"""Seconds between looks at the device-plugin directory while no watch tells of changes,
and while a registration waits for its retry."""
SAFETY_INTERVAL = 10.0
"""Seconds between looks at the watched directory when nothing changed there."""
REGISTER_TIMEOUT = 5.0
"""Seconds a registration may take, as upstream dials."""
RETRY_INTERVAL = 2.0
"""Seconds before a failed registration is tried again."""

Servers = Callable[[], Iterable[PluginServer]]
"""The servers to keep registered, asked anew on every look."""
Status = Callable[[str | None], None]
"""Told what stands in the way of registration (None: nothing)."""


async def register(kubelet_socket: Path, server: PluginServer, *, timeout: float) -> None:
    """Register `server` with the kubelet at `kubelet_socket`; raises `RegistrationFailed`."""
    request = api_pb2.RegisterRequest(
        version=constants.VERSION,
        endpoint=server.socket.name,
        resource_name=server.name,
        options=server.options,
    )
    try:
        with UnixTarget(kubelet_socket) as target:
            async with grpc.aio.insecure_channel(target.address) as channel:
                stub = api_pb2_grpc.RegistrationStub(channel)
                await stub.Register(request, timeout=timeout, wait_for_ready=True)
    except grpc.aio.AioRpcError as error:
        raise RegistrationFailed(
            f"{server.name}: the kubelet answered {error.code().name}: {error.details()}"
        ) from None
    except OSError as error:
        raise RegistrationFailed(f"{server.name}: cannot reach {kubelet_socket}: {error}") from None


class Registrar:
    """Registers servers with the kubelet of one device-plugin directory."""

    def __init__(
        self,
        directory: Path,
        servers: Servers,
        metrics: PluginMetrics,
        *,
        status: Status | None = None,
        poll_interval: float = POLL_INTERVAL,
        safety_interval: float = SAFETY_INTERVAL,
        timeout: float = REGISTER_TIMEOUT,
        retry_interval: float = RETRY_INTERVAL,
    ) -> None:
        self.kubelet_socket = directory / constants.KUBELET_SOCKET
        self._servers = servers
        self._metrics = metrics
        self._status = status or (lambda problem: None)
        self._directory = directory
        self._poll_interval = poll_interval
        self._safety_interval = safety_interval
        self._timeout = timeout
        self._retry_interval = retry_interval
        self._kubelet: SocketIdentity | None = None
        self._registered: dict[str, SocketIdentity | None] = {}
        """The servers registered, each with the kubelet socket found just after its
        registration was accepted: the kubelet that took it."""
        self._retry_at: dict[str, float] = {}
        self._unwatched: str | None = None
        """Why the directory is not watched, as last logged; None while it is."""

    async def run(self, stopping: asyncio.Event) -> None:
        """Keep the servers registered until `stopping` is set."""
        watch: inotify.DirectoryWatch | None = None
        try:
            while not stopping.is_set():
                watch = self._watching(watch)
                await self.sync()
                if watch is None:
                    await waiting.stopped_within(stopping, self._poll_interval)
                    continue
                retry_pending = self._kubelet is not None and bool(self._retry_at)
                await waiting.idle(
                    self._poll_interval if retry_pending else self._safety_interval,
                    wake=watch.changed,
                    stopping=stopping,
                )
        finally:
            if watch is not None:
                watch.close()

    async def sync(self) -> None:
        """One look at the directory, and whatever it calls for."""
        kubelet = identity(self.kubelet_socket)
        if kubelet is None:
            if self._kubelet is not None:
                log.warning("%s is gone: waiting for the kubelet", self.kubelet_socket)
            self._kubelet = None
            self._registered.clear()
            self._status(f"no kubelet at {self.kubelet_socket}")
            return
        if kubelet != self._kubelet:
            # a server registered with this kubelet already (its registration waited for
            # the new socket) is not registered again: the kubelet refuses a second
            # connection to the same socket for good (`device plugin already connected`)
            again = sorted(name for name, taken in self._registered.items() if taken != kubelet)
            if self._kubelet is not None and again:
                log.info("the kubelet restarted: registering %s again", ", ".join(again))
            self._kubelet = kubelet
            self._registered = {n: t for n, t in self._registered.items() if t == kubelet}
            self._retry_at.clear()
        problems = [problem for server in self._servers() if (problem := await self._keep(server))]
        self._status(problems[0] if problems else None)

    def _watching(self, watch: inotify.DirectoryWatch | None) -> inotify.DirectoryWatch | None:
        """The watch on the directory: `watch` while it holds, else a new one if it can be
        set now. Set before the look that follows, so no change falls in between."""
        if watch is not None and not watch.gone:
            return watch
        if watch is not None:
            watch.close()
        try:
            watch = inotify.DirectoryWatch(self._directory)
        except inotify.WatchUnavailable as error:
            if self._unwatched != str(error):
                log.info("looking every %.1f s: %s", self._poll_interval, error)
                self._unwatched = str(error)
            return None
        if self._unwatched is not None:
            log.info("watching %s", self._directory)
            self._unwatched = None
        return watch

    async def _keep(self, server: PluginServer) -> str | None:
        """Make sure `server` serves and is registered; what failed, if anything."""
        if not server.serving:
            log.info("the socket of %s is gone: serving it again", server.name)
            await server.restart()
            self._registered.pop(server.name, None)
        if server.name in self._registered:
            return None
        loop = asyncio.get_running_loop()
        if loop.time() < self._retry_at.get(server.name, 0.0):
            return f"registration of {server.name} failed; retrying"
        try:
            await register(self.kubelet_socket, server, timeout=self._timeout)
        except RegistrationFailed as error:
            self._metrics.registration(server.name, ok=False)
            self._retry_at[server.name] = loop.time() + self._retry_interval
            log.warning("registration failed, retrying in %.1f s: %s", self._retry_interval, error)
            return str(error)
        self._metrics.registration(server.name, ok=True)
        self._registered[server.name] = identity(self.kubelet_socket)
        self._retry_at.pop(server.name, None)
        log.info("registered %s with the kubelet as %s", server.name, server.socket.name)
        return None
