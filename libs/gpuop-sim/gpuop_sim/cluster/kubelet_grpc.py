"""The kubelet's gRPC side, simulated: device plugin registration, ListAndWatch, Allocate,
kubelet restarts, and the PodResources API, on real unix sockets.

Tests, the benchmark, the demo and telemetry run one `KubeletGrpc` per simulated node on
that node's kubelet directory (`KubeletGrpc.under(host_root)` uses
`<host root>/var/lib/kubelet`, where a device plugin started with the same `--host-root`
looks). It behaves as the real kubelet does (pkg/kubelet/cm/devicemanager):

    Register       rejects another API version or a resource name without a domain (or in
                   kubernetes.io), dials the plugin's socket back and calls
                   GetDevicePluginOptions before it answers, then opens ListAndWatch
    ListAndWatch   every message replaces the resource's whole device list; a stream that
                   ends marks every device Unhealthy, and nothing redials
    restart()      removes every file of the device-plugin directory except the checkpoint
                   and creates a new kubelet.sock: plugins must notice and register again
    PodResources   answers List, Get and GetAllocatableResources from the allocations made
                   through `allocate()` (`gpuop_sim.cluster.pod_resources`)
    DRA plugins    register through `plugins_registry` in the kubelet directory
                   (`gpuop_sim.cluster.plugin_watcher`), watched while the kubelet runs

    kubelet = KubeletGrpc.under(host_root)
    await kubelet.start()
    devices = await kubelet.wait_for_devices("nvidia.com/gpu", lambda d: len(d) == 8)
    response = await kubelet.allocate("nvidia.com/gpu", [devices[0].ID], pod="trainer")
    ...
    await kubelet.stop()

Errors the plugin answers with reach the caller as `grpc.aio.AioRpcError`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from gpuop.kubelet import constants, statuses
from gpuop.kubelet.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from gpuop.kubelet.podresources.v1 import api_pb2_grpc as podresources_grpc
from gpuop.kubelet.sockets import UnixTarget
from gpuop_sim.cluster.plugin_watcher import PLUGINS_REGISTRY, PluginWatcher
from gpuop_sim.cluster.pod_resources import Allocation, PodResourcesServicer

log = logging.getLogger(__name__)

DIAL_TIMEOUT = 10.0
"""Seconds the kubelet waits for a registering plugin's socket to answer."""

DeviceCheck = Callable[[tuple[api_pb2.Device, ...]], bool]
"""A condition on a resource's device list, for `wait_for_devices`."""


class KubeletError(RuntimeError):
    """The simulated kubelet cannot do what it was asked: no plugin serves the resource."""


@dataclass
class PluginConnection:
    """One registered device plugin, as the kubelet holds it."""

    request: api_pb2.RegisterRequest
    options: api_pb2.DevicePluginOptions
    target: UnixTarget
    channel: grpc.aio.Channel
    stub: api_pb2_grpc.DevicePluginStub
    devices: tuple[api_pb2.Device, ...] = ()
    streaming: asyncio.Task[None] | None = field(default=None, repr=False)

    async def close(self) -> None:
        if self.streaming is not None:
            self.streaming.cancel()
            await asyncio.gather(self.streaming, return_exceptions=True)
        await self.channel.close(None)
        self.target.close()


class KubeletGrpc(api_pb2_grpc.RegistrationServicer):
    """A node's kubelet as device plugins and PodResources clients see it."""

    def __init__(self, device_plugin_dir: Path, pod_resources_dir: Path) -> None:
        self.device_plugin_dir = device_plugin_dir
        """Where plugins put their sockets and the kubelet its `kubelet.sock`."""
        self.pod_resources_socket = pod_resources_dir / constants.POD_RESOURCES_SOCKET
        """The PodResources socket telemetry dials."""
        self.registrations: list[api_pb2.RegisterRequest] = []
        """Every accepted registration, in order (a re-registration appears again)."""
        self.allocations: list[Allocation] = []
        """Every container's allocation, oldest first, until its pod is released."""
        self._plugins: dict[str, PluginConnection] = {}
        self._changed = asyncio.Condition()
        self._servers: list[tuple[grpc.aio.Server, UnixTarget]] = []
        self.plugin_watcher = PluginWatcher(device_plugin_dir.parent / PLUGINS_REGISTRY)
        """Registers the DRA kubelet plugins of this node."""

    @classmethod
    def under(cls, host_root: Path) -> KubeletGrpc:
        """The kubelet of the node whose host root is `host_root`, on the real kubelet's
        paths under it."""
        return cls(host_root / constants.DEVICE_PLUGIN_DIR, host_root / constants.POD_RESOURCES_DIR)

    @property
    def kubelet_socket(self) -> Path:
        return self.device_plugin_dir / constants.KUBELET_SOCKET

    @property
    def resources(self) -> tuple[str, ...]:
        """Resources with a registered plugin, sorted."""
        return tuple(sorted(self._plugins))

    # Lifecycle.

    async def start(self) -> None:
        """Create both sockets and serve Registration and PodResources on them."""
        self.device_plugin_dir.mkdir(parents=True, exist_ok=True)
        self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
        registration = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(self, registration)
        pod_resources = grpc.aio.server()
        podresources_grpc.add_PodResourcesListerServicer_to_server(
            PodResourcesServicer(self._allocated, self._allocatable), pod_resources
        )
        for server, path in (
            (registration, self.kubelet_socket),
            (pod_resources, self.pod_resources_socket),
        ):
            path.unlink(missing_ok=True)
            target = UnixTarget(path)
            server.add_insecure_port(target.address)
            await server.start()
            self._servers.append((server, target))
        await self.plugin_watcher.start()

    async def stop(self) -> None:
        """The kubelet goes away: its servers stop, its sockets go, every plugin stream is
        dropped (so their devices read Unhealthy), DRA plugins are forgotten. Allocations
        are kept, as in the kubelet's checkpoint."""
        await self.plugin_watcher.stop()
        for server, target in self._servers:
            await server.stop(None)
            target.close()
            target.path.unlink(missing_ok=True)
        self._servers.clear()
        for plugin in list(self._plugins.values()):
            await plugin.close()
            plugin.devices = _unhealthy(plugin.devices)
        async with self._changed:
            self._changed.notify_all()

    async def restart(self) -> None:
        """A kubelet restart: stop, remove every file of the device-plugin directory but
        the checkpoint (the plugins' sockets too), start with a new `kubelet.sock`."""
        await self.stop()
        for entry in self.device_plugin_dir.iterdir():
            if entry.name != constants.CHECKPOINT and not entry.is_dir():
                entry.unlink(missing_ok=True)
        self._plugins.clear()
        await self.start()

    # Registration, served to device plugins.

    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.Empty:
        problem = _registration_problem(request)
        if problem is not None:
            await statuses.abort(context, grpc.StatusCode.INVALID_ARGUMENT, problem)
        try:
            plugin = await self._connect(request)
        except (grpc.aio.AioRpcError, OSError) as error:
            await statuses.abort(
                context,
                grpc.StatusCode.UNAVAILABLE,
                f"cannot reach the plugin of {request.resource_name} at {request.endpoint}:"
                f" {error}",
            )
        previous = self._plugins.pop(request.resource_name, None)
        if previous is not None:
            await previous.close()
        self._plugins[request.resource_name] = plugin
        async with self._changed:
            self.registrations.append(request)
            self._changed.notify_all()
        plugin.streaming = asyncio.create_task(
            self._list_and_watch(plugin), name=f"kubelet-law-{request.resource_name}"
        )
        log.info("registered %s at %s", request.resource_name, request.endpoint)
        return api_pb2.Empty()

    async def _connect(self, request: api_pb2.RegisterRequest) -> PluginConnection:
        target = UnixTarget(self.device_plugin_dir / request.endpoint)
        channel = grpc.aio.insecure_channel(target.address)
        stub = api_pb2_grpc.DevicePluginStub(channel)
        try:
            options = await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=DIAL_TIMEOUT)
        except BaseException:
            await channel.close(None)
            target.close()
            raise
        return PluginConnection(request, options, target, channel, stub)

    async def _list_and_watch(self, plugin: PluginConnection) -> None:
        resource = plugin.request.resource_name
        try:
            async for response in plugin.stub.ListAndWatch(api_pb2.Empty()):
                async with self._changed:
                    plugin.devices = tuple(response.devices)
                    self._changed.notify_all()
        except grpc.aio.AioRpcError as error:
            log.info("ListAndWatch of %s ended: %s", resource, error.code())
        async with self._changed:  # as the kubelet does: nothing left is allocatable
            plugin.devices = _unhealthy(plugin.devices)
            self._changed.notify_all()

    # What tests and the demo ask of the kubelet.

    def plugin(self, resource: str) -> PluginConnection:
        """The registered plugin of `resource`; `KubeletError` when there is none."""
        plugin = self._plugins.get(resource)
        if plugin is None:
            known = ", ".join(self.resources) or "none"
            raise KubeletError(f"no device plugin registered for {resource} (registered: {known})")
        return plugin

    def devices(self, resource: str) -> tuple[api_pb2.Device, ...]:
        """The device list last streamed for `resource`; empty before any."""
        plugin = self._plugins.get(resource)
        return () if plugin is None else plugin.devices

    async def wait_for_devices(
        self, resource: str, check: DeviceCheck = bool, *, timeout: float = 10.0
    ) -> tuple[api_pb2.Device, ...]:
        """The device list of `resource` once `check` holds for it (by default: not empty).
        Raises `TimeoutError` when it does not within `timeout` seconds."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: check(self.devices(resource)))
            return self.devices(resource)

    async def wait_for_registrations(self, count: int, *, timeout: float = 10.0) -> None:
        """Return once `count` registrations were accepted since this kubelet was made."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: len(self.registrations) >= count)

    async def allocate(
        self,
        resource: str,
        device_ids: Sequence[str],
        *,
        pod: str,
        container: str = "main",
        namespace: str = "default",
    ) -> api_pb2.ContainerAllocateResponse:
        """Allocate `device_ids` of `resource` to one container, as at pod admission; the
        allocation is then listed by PodResources until `release_pod`."""
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=device_ids)]
        )
        response = await self.plugin(resource).stub.Allocate(request)
        answer: api_pb2.ContainerAllocateResponse = response.container_responses[0]
        self.allocations.append(
            Allocation(namespace, pod, container, resource, tuple(device_ids), answer)
        )
        return answer

    async def preferred_allocation(
        self,
        resource: str,
        available: Sequence[str],
        size: int,
        must_include: Sequence[str] = (),
    ) -> tuple[str, ...]:
        """The plugin's preferred `size` devices among `available`."""
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available,
                    must_include_deviceIDs=must_include,
                    allocation_size=size,
                )
            ]
        )
        response = await self.plugin(resource).stub.GetPreferredAllocation(request)
        return tuple(response.container_responses[0].deviceIDs)

    def release_pod(self, namespace: str, pod: str) -> None:
        """The pod is gone: its devices leave PodResources."""
        self.allocations = [a for a in self.allocations if (a.namespace, a.pod) != (namespace, pod)]

    async def __aenter__(self) -> KubeletGrpc:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    # PodResources' view of this kubelet.

    def _allocated(self) -> tuple[tuple[Allocation, tuple[api_pb2.Device, ...]], ...]:
        return tuple((a, self.devices(a.resource)) for a in self.allocations)

    def _allocatable(self) -> dict[str, tuple[api_pb2.Device, ...]]:
        return {
            resource: tuple(d for d in plugin.devices if d.health == constants.HEALTHY)
            for resource, plugin in sorted(self._plugins.items())
        }


def _registration_problem(request: api_pb2.RegisterRequest) -> str | None:
    """Why the kubelet refuses a registration; None when it accepts it."""
    if request.version != constants.VERSION:
        return f"unsupported device plugin API version {request.version!r}"
    domain, slash, name = request.resource_name.partition("/")
    if not slash or not domain or not name:
        return f"invalid extended resource name {request.resource_name!r}: it needs a domain"
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return f"invalid extended resource name {request.resource_name!r}: kubernetes.io"
    if not request.endpoint or "/" in request.endpoint:
        return f"invalid endpoint {request.endpoint!r}: a socket name in the plugin directory"
    return None


def _unhealthy(devices: tuple[api_pb2.Device, ...]) -> tuple[api_pb2.Device, ...]:
    return tuple(
        api_pb2.Device(ID=d.ID, health=constants.UNHEALTHY, topology=d.topology) for d in devices
    )
