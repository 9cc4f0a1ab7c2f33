"""The DRA kubelet plugin's gRPC servers: registration, DRAPlugin and DRAResourceHealth.

Two unix sockets under the host root's kubelet directory, the paths NVIDIA's driver uses:

    plugins_registry/gpu.nvidia.com-reg.sock   Registration: GetInfo answers
        PluginInfo{DRAPlugin, gpu.nvidia.com, <dra.sock as the kubelet sees it>,
        [v1.DRAPlugin, v1beta1.DRAPlugin, v1.DRAResourceHealth]} (v1 first: the kubelet
        takes the first it speaks); NotifyRegistrationStatus tells `on_registration`
    plugins/gpu.nvidia.com/dra.sock            DRAPlugin v1 and v1beta1 (the same answers,
        v1beta1 without `share_id`), and DRAResourceHealth v1

The kubelet watches `plugins_registry` for sockets, so the registration socket is bound
last and removed first: the kubelet never dials a plugin that does not serve yet.

NodePrepareResources and NodeUnprepareResources answer every claim asked (`preparing`, under
one lock, which the sweep of half-prepared claims every `preparing.SWEEP_INTERVAL` seconds
takes too); NodeWatchResources streams every device's health at once, again on every change,
and again every `resend_interval` seconds, well within the kubelet's 30 s after which a
device not re-reported turns Unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import grpc

from gpuop.clocks import Clock, SystemClock
from gpuop.events import dra
from gpuop.kubelet import sockets
from gpuop.kubelet.dra.v1 import api_pb2 as v1
from gpuop.kubelet.dra.v1 import api_pb2_grpc as v1_grpc
from gpuop.kubelet.dra.v1beta1 import api_pb2 as v1beta1
from gpuop.kubelet.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from gpuop.kubelet.dra_health.v1 import api_pb2 as health_pb2
from gpuop.kubelet.dra_health.v1 import api_pb2_grpc as health_grpc
from gpuop.kubelet.pluginregistration.v1 import api_pb2 as registration_pb2
from gpuop.kubelet.pluginregistration.v1 import api_pb2_grpc as registration_grpc
from gpuop.kubelet.sockets import UnixTarget
from gpuop.services.device_plugin.dra.preparing import (
    SWEEP_INTERVAL,
    ClaimName,
    Prepared,
    PrepareError,
    Preparer,
)

log = logging.getLogger(__name__)

KUBELET_DIR = "var/lib/kubelet"
"""The kubelet's root directory, relative to the host root."""
PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth")
HOST_ROOT = PurePosixPath("/")
"""Where the kubelet sees the host root: the socket paths it is told are absolute there."""
RESEND_INTERVAL = 10.0
"""Seconds between two full health reports on an open stream."""


def registration_socket(kubelet_dir: str = KUBELET_DIR) -> str:
    return f"{kubelet_dir}/plugins_registry/{dra.DRIVER}-reg.sock"


def plugin_socket(kubelet_dir: str = KUBELET_DIR) -> str:
    return f"{kubelet_dir}/plugins/{dra.DRIVER}/dra.sock"


@dataclass(frozen=True)
class DeviceHealth:
    """One device's health, as the kubelet is told it."""

    pool: str
    device: str
    healthy: bool
    message: str = ""


Registered = Callable[[bool, str], None]
"""Told whether the kubelet registered the plugin, and its error when it did not."""


class DraServer:
    """Serves one node's DRA plugin to the kubelet while started."""

    def __init__(
        self,
        host_root: Path,
        preparer: Preparer,
        health: Callable[[], Sequence[DeviceHealth]],
        *,
        on_registration: Registered | None = None,
        kubelet_dir: str = KUBELET_DIR,
        seen_as: PurePosixPath = HOST_ROOT,
        resend_interval: float = RESEND_INTERVAL,
        clock: Clock | None = None,
    ) -> None:
        self.registration_path = host_root / registration_socket(kubelet_dir)
        self.plugin_path = host_root / plugin_socket(kubelet_dir)
        self.endpoint = str(seen_as / plugin_socket(kubelet_dir))
        """The DRA socket's path as the kubelet sees it (the host's own root)."""
        self._preparer = preparer
        self._health = health
        self._on_registration = on_registration or (lambda registered, error: None)
        self._resend_interval = resend_interval
        self._clock = clock or SystemClock()
        self._lock = asyncio.Lock()
        self._health_changed = asyncio.Condition()
        self._health_version = 0
        self._stopping = asyncio.Event()
        self._servers: list[tuple[grpc.aio.Server, UnixTarget, Path]] = []
        self._sweeping: asyncio.Task[None] | None = None

    @property
    def serving(self) -> bool:
        return bool(self._servers)

    async def start(self) -> None:
        """Serve the DRA socket, then the registration socket; a no-op when serving."""
        if self._servers:
            return
        self._stopping.clear()
        plugin = grpc.aio.server()
        v1_grpc.add_DRAPluginServicer_to_server(_V1(self), plugin)
        v1beta1_grpc.add_DRAPluginServicer_to_server(_V1beta1(self), plugin)
        health_grpc.add_DRAResourceHealthServicer_to_server(_Health(self), plugin)
        await self._bind(plugin, self.plugin_path)
        registration = grpc.aio.server()
        registration_grpc.add_RegistrationServicer_to_server(_Registration(self), registration)
        await self._bind(registration, self.registration_path)
        self._sweeping = asyncio.create_task(self._sweep_every(), name="dra-sweep")
        log.info("DRA plugin %s serving on %s", dra.DRIVER, self.plugin_path)

    async def stop(self) -> None:
        """Stop serving and remove both sockets, registration first; a no-op when stopped."""
        self._stopping.set()
        sweeping, self._sweeping = self._sweeping, None
        if sweeping is not None:
            sweeping.cancel()
            await asyncio.gather(sweeping, return_exceptions=True)
        async with self._health_changed:
            self._health_changed.notify_all()
        while self._servers:
            server, target, path = self._servers.pop()
            await asyncio.to_thread(path.unlink, missing_ok=True)
            await server.stop(None)
            target.close()

    async def health_changed(self) -> None:
        """Send every open health stream the devices' health now."""
        async with self._health_changed:
            self._health_version += 1
            self._health_changed.notify_all()

    async def _bind(self, server: grpc.aio.Server, path: Path) -> None:
        self._servers.append((server, await sockets.serve(server, path), path))

    async def prepare(self, claims: Sequence[ClaimName]) -> dict[str, Prepared]:
        async with self._lock:
            return {
                claim.uid: await asyncio.to_thread(self._preparer.prepare, claim)
                for claim in claims
            }

    async def unprepare(self, uids: Sequence[str]) -> dict[str, str]:
        async with self._lock:
            return {uid: await asyncio.to_thread(self._preparer.unprepare, uid) for uid in uids}

    async def sweep(self) -> tuple[str, ...]:
        """Sweep the stale half-prepared claims (`Preparer.sweep`); the uids swept."""
        async with self._lock:
            return await asyncio.to_thread(self._preparer.sweep)

    async def _sweep_every(self) -> None:
        while True:
            await self._clock.sleep(SWEEP_INTERVAL)
            await self.sweep()

    async def watch(self) -> AsyncIterator[health_pb2.NodeWatchResourcesResponse]:
        version = -1
        while not self._stopping.is_set():
            async with self._health_changed:
                version = self._health_version
            yield _health_response(self._health(), int(self._clock.now().timestamp()))
            async with self._health_changed:
                if self._health_version == version and not self._stopping.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            self._health_changed.wait(), timeout=self._resend_interval
                        )

    def registered(self, registered: bool, error: str) -> None:
        if registered:
            log.info("the kubelet registered DRA plugin %s", dra.DRIVER)
        else:
            log.error("the kubelet refused DRA plugin %s: %s", dra.DRIVER, error)
        self._on_registration(registered, error)


def _claim(claim: v1.Claim | v1beta1.Claim) -> ClaimName:
    return ClaimName(claim.namespace, claim.name, claim.uid)


class _V1(v1_grpc.DRAPluginServicer):
    def __init__(self, server: DraServer) -> None:
        self._server = server

    async def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> v1.NodePrepareResourcesResponse:
        answers = await self._server.prepare([_claim(c) for c in request.claims])
        response = v1.NodePrepareResourcesResponse()
        for uid, answer in answers.items():
            if isinstance(answer, PrepareError):
                response.claims[uid].error = str(answer)
                continue
            response.claims[uid].devices.extend(
                v1.Device(
                    request_names=d.request_names,
                    pool_name=d.pool_name,
                    device_name=d.device_name,
                    cdi_device_ids=d.cdi_device_ids,
                )
                for d in answer
            )
        return response

    async def NodeUnprepareResources(
        self, request: v1.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> v1.NodeUnprepareResourcesResponse:
        errors = await self._server.unprepare([c.uid for c in request.claims])
        response = v1.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        return response


class _V1beta1(v1beta1_grpc.DRAPluginServicer):
    """The same answers as v1, in v1beta1's messages (no `share_id`)."""

    def __init__(self, server: DraServer) -> None:
        self._v1 = _V1(server)

    async def NodePrepareResources(
        self, request: v1beta1.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> v1beta1.NodePrepareResourcesResponse:
        answer = await self._v1.NodePrepareResources(
            v1.NodePrepareResourcesRequest.FromString(request.SerializeToString()), context
        )
        return v1beta1.NodePrepareResourcesResponse.FromString(answer.SerializeToString())

    async def NodeUnprepareResources(
        self, request: v1beta1.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        answer = await self._v1.NodeUnprepareResources(
            v1.NodeUnprepareResourcesRequest.FromString(request.SerializeToString()), context
        )
        return v1beta1.NodeUnprepareResourcesResponse.FromString(answer.SerializeToString())


class _Health(health_grpc.DRAResourceHealthServicer):
    def __init__(self, server: DraServer) -> None:
        self._server = server

    async def NodeWatchResources(
        self, request: health_pb2.NodeWatchResourcesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[health_pb2.NodeWatchResourcesResponse]:
        async for response in self._server.watch():
            yield response


class _Registration(registration_grpc.RegistrationServicer):
    def __init__(self, server: DraServer) -> None:
        self._server = server

    async def GetInfo(
        self, request: registration_pb2.InfoRequest, context: grpc.aio.ServicerContext
    ) -> registration_pb2.PluginInfo:
        return registration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=dra.DRIVER,
            endpoint=self._server.endpoint,
            supported_versions=SUPPORTED_VERSIONS,
        )

    async def NotifyRegistrationStatus(
        self, request: registration_pb2.RegistrationStatus, context: grpc.aio.ServicerContext
    ) -> registration_pb2.RegistrationStatusResponse:
        self._server.registered(request.plugin_registered, request.error)
        return registration_pb2.RegistrationStatusResponse()


def _health_response(
    devices: Sequence[DeviceHealth], now: int
) -> health_pb2.NodeWatchResourcesResponse:
    return health_pb2.NodeWatchResourcesResponse(
        devices=[
            health_pb2.DeviceHealth(
                device=health_pb2.DeviceIdentifier(pool_name=d.pool, device_name=d.device),
                health=health_pb2.HEALTHY if d.healthy else health_pb2.UNHEALTHY,
                last_updated_time=now,
                message=d.message[:1024],
            )
            for d in devices
        ]
    )
