"""Which pods the kubelet gave which devices: PodResources `List` over its unix socket.

The device plugin asks it for the remediation saga's `ListGpuHolders` (its `holders`
module maps the device ids back to GPUs). `KubeletPodResources` opens one gRPC channel on
`<host root>/var/lib/kubelet/pod-resources/kubelet.sock` on first use and drops it after a
failed call, so a restarted kubelet (a new socket at the same path) is reached again on the
next call. A missing socket is reported without trying to connect: the usual cause is a
DaemonSet that does not mount the pod-resources directory. The simulated kubelet serves the
same API (`gpuop_sim.cluster.pod_resources`). Telemetry's `kubelet_pods` asks through it
too, for its pod labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc

from gpuop.kubelet import constants
from gpuop.kubelet.podresources.v1 import api_pb2, api_pb2_grpc
from gpuop.kubelet.sockets import UnixTarget

LIST_TIMEOUT_SECONDS = 10.0
"""How long one `List` may take (dcgm-exporter's timeout)."""


class PodResourcesUnavailable(Exception):
    """The kubelet could not be asked: no socket, no answer in time, or an error answer."""


@dataclass(frozen=True, slots=True)
class Allocation:
    """One device id of one extended resource, given to one container of a pod."""

    resource_name: str
    """`nvidia.com/gpu`, `nvidia.com/mig-1g.18gb`, `rdma/rdma_shared_device_a`, ..."""
    device_id: str
    """The id as the device plugin advertised it."""
    namespace: str
    pod: str
    container: str


class PodResources(Protocol):
    """Who holds which device on this node, as the kubelet says."""

    async def allocations(self) -> tuple[Allocation, ...]:
        """Every device id given to a running container; raises `PodResourcesUnavailable`."""
        ...

    async def close(self) -> None:
        """Let go of the connection, if any."""
        ...


def socket_under(host_root: Path) -> Path:
    """The kubelet's PodResources socket of a node whose `/` is at `host_root`."""
    return host_root / constants.POD_RESOURCES_DIR / constants.POD_RESOURCES_SOCKET


class KubeletPodResources:
    """PodResources `List` on the kubelet's unix socket; a `PodResources`."""

    def __init__(self, socket: Path, *, timeout: float = LIST_TIMEOUT_SECONDS) -> None:
        self.socket = socket
        self._timeout = timeout
        self._target: UnixTarget | None = None
        self._channel: grpc.aio.Channel | None = None

    async def allocations(self) -> tuple[Allocation, ...]:
        if not self.socket.is_socket():
            raise PodResourcesUnavailable(
                f"no kubelet PodResources socket at {self.socket}: is the pod-resources"
                " directory mounted?"
            )
        stub = api_pb2_grpc.PodResourcesListerStub(self._connect())
        try:
            answer = await stub.List(api_pb2.ListPodResourcesRequest(), timeout=self._timeout)
        except grpc.aio.AioRpcError as error:
            await self.close()
            raise PodResourcesUnavailable(
                f"PodResources List on {self.socket}: {error.code().name}: {error.details()}"
            ) from None
        return tuple(
            Allocation(devices.resource_name, device_id, pod.namespace, pod.name, container.name)
            for pod in answer.pod_resources
            for container in pod.containers
            for devices in container.devices
            for device_id in devices.device_ids
        )

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        target, self._target = self._target, None
        if channel is not None:
            await channel.close()
        if target is not None:
            target.close()

    def _connect(self) -> grpc.aio.Channel:
        if self._channel is None:
            try:
                self._target = UnixTarget(self.socket)
            except OSError as error:
                raise PodResourcesUnavailable(f"cannot reach {self.socket}: {error}") from None
            self._channel = grpc.aio.insecure_channel(self._target.address)
        return self._channel
