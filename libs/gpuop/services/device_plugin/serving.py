"""One gRPC `DevicePlugin` server per advertised resource, on its own unix socket.

`plugins.DevicePlugins` creates a `PluginServer` for each resource it advertises, hands
it every new device list through `advertise`, and `registering.Registrar` registers it
with the kubelet once it serves. The socket lies in the kubelet's device-plugin directory,
named after the resource (`nvidia-gpu.sock`, `nvidia-mig-1g.18gb.sock`,
`rdma-roce_shared.sock`), so any kubelet speaking v1beta1 there can use it.

    GetDevicePluginOptions   no PreStartContainer; GetPreferredAllocation where it helps
    ListAndWatch             the full device list at once, then again after every change
    Allocate                 every container's answer, or INVALID_ARGUMENT naming what is
                             wrong (an unknown id, a shared request over one): all or nothing;
                             an answer given once is kept for the same request
    GetPreferredAllocation   the resource's choice, from memory
    PreStartContainer        nothing to do
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import grpc

from gpuop.kubelet import sockets, statuses
from gpuop.kubelet.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from gpuop.kubelet.sockets import UnixTarget
from gpuop.services.device_plugin.errors import AllocationError
from gpuop.services.device_plugin.metrics import PluginMetrics
from gpuop.services.device_plugin.resources import Resource

log = logging.getLogger(__name__)

SocketIdentity = tuple[int, int, int]
"""Device, inode and change time of a socket file: a re-created file differs."""
AllocationKey = tuple[tuple[str, ...], ...]
"""An AllocateRequest as a dict key: each container's device ids, in the order asked."""
KEPT_ANSWERS = 256
"""Distinct requests a server keeps the answer to: every id of a node with replicas and the
multi-GPU requests it sees, not every subset of its devices."""


def socket_name(resource: str) -> str:
    """The socket file of a resource: the domain's first label, then the name:
    `nvidia.com/gpu` is `nvidia-gpu.sock`."""
    domain, _, name = resource.partition("/")
    return f"{domain.split('.')[0]}-{name}.sock"


def identity(path: Path) -> SocketIdentity | None:
    """Who the file at `path` is now; None when there is none."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return None
    return (status.st_dev, status.st_ino, status.st_ctime_ns)


class PluginServer(api_pb2_grpc.DevicePluginServicer):
    """Serves one resource's devices to the kubelet."""

    def __init__(
        self,
        resource: Resource,
        devices: tuple[api_pb2.Device, ...],
        directory: Path,
        metrics: PluginMetrics,
    ) -> None:
        self.resource = resource
        """What Allocate and GetPreferredAllocation answer from; replaced with each list."""
        self.socket = directory / socket_name(resource.name)
        self._devices = devices
        self._version = 1
        self._changed = asyncio.Condition()
        self._metrics = metrics
        self._answers: dict[AllocationKey, api_pb2.AllocateResponse] = {}
        self._answers_from = resource
        """The resource `_answers` were built from; another one means they are stale."""
        self._server: grpc.aio.Server | None = None
        self._target: UnixTarget | None = None
        self._identity: SocketIdentity | None = None

    @property
    def name(self) -> str:
        return self.resource.name

    @property
    def options(self) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(
            pre_start_required=False,
            get_preferred_allocation_available=self.resource.preferred_allocation_available,
        )

    @property
    def devices(self) -> tuple[api_pb2.Device, ...]:
        """The device list last advertised."""
        return self._devices

    @property
    def serving(self) -> bool:
        """Started, and its socket is still the file it bound (a restarting kubelet
        deletes it)."""
        return self._server is not None and identity(self.socket) == self._identity

    async def start(self) -> None:
        """Bind the socket (replacing a stale file) and serve."""
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, server)
        target = await sockets.serve(server, self.socket)
        self._server, self._target = server, target
        self._identity = identity(self.socket)
        log.info("serving %s on %s", self.name, self.socket)

    async def stop(self) -> None:
        """Stop serving (open streams end) and remove the socket; a no-op when stopped."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(None)
        if self._target is not None:
            self._target.close()
            self._target = None
        if self._identity is not None and identity(self.socket) == self._identity:
            self.socket.unlink(missing_ok=True)  # never a file someone else put there
        self._identity = None

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def advertise(self, resource: Resource, devices: tuple[api_pb2.Device, ...]) -> bool:
        """Serve `resource` with this device list from now on; open ListAndWatch streams
        get it when it differs from the last. Returns whether it did."""
        self.resource = resource
        if list(devices) == list(self._devices):
            return False
        async with self._changed:
            self._devices = devices
            self._version += 1
            self._changed.notify_all()
        self._metrics.advertised(self.name, devices)
        return True

    # The DevicePlugin service.

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return self.options

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        sent = 0
        while True:
            async with self._changed:
                await self._changed.wait_for(partial(self._newer_than, sent))
                sent, devices = self._version, self._devices
            yield api_pb2.ListAndWatchResponse(devices=devices)

    def _newer_than(self, version: int) -> bool:
        return self._version != version

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.AllocateResponse:
        """The answer is kept per request: it depends on the resource alone, a frozen object
        that `advertise` replaces whenever its devices, sharing, device list strategies, CDI
        or MPS settings change, and never on health (the kubelet allocates only healthy
        devices). So answers are dropped with the resource they came from, and a repeated
        request skips building the same messages again. Refusals are not kept."""
        resource = self.resource
        if resource is not self._answers_from:
            self._answers, self._answers_from = {}, resource
        key = tuple(tuple(c.devices_ids) for c in request.container_requests)
        answer = self._answers.get(key)
        if answer is None:
            try:
                responses = [resource.allocate(ids) for ids in key]
            except AllocationError as error:
                self._metrics.allocation(self.name, ok=False)
                log.warning("refused an allocation of %s: %s", self.name, error)
                await statuses.abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(error))
            answer = api_pb2.AllocateResponse(container_responses=responses)
            if len(self._answers) < KEPT_ANSWERS:
                self._answers[key] = answer
        self._metrics.allocation(self.name, ok=True)
        return answer

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        resource = self.resource
        try:
            chosen = [
                resource.preferred(
                    c.available_deviceIDs, c.must_include_deviceIDs, c.allocation_size
                )
                for c in request.container_requests
            ]
        except AllocationError as error:
            await statuses.abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(error))
        return api_pb2.PreferredAllocationResponse(
            container_responses=[
                api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids) for ids in chosen
            ]
        )

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()
