"""The kubelet's answer to "who holds which device": PodResources `List` over its socket.

`KubeletPodResources` is the `pods.PodResourcesSource` of a real node (and of the simulated
kubelet, which serves the same API): one gRPC channel on
`<host root>/var/lib/kubelet/pod-resources/kubelet.sock`, opened on first use and dropped
after a failed call, so a restarted kubelet (a new socket at the same path) is reached again
on the next refresh. A missing socket is reported without trying to connect: the usual
cause is a DaemonSet that does not mount the pod-resources directory.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from gpuop.kubelet.podresources.v1 import api_pb2, api_pb2_grpc
from gpuop.kubelet.sockets import UnixTarget
from gpuop.services.telemetry.pods import DeviceAssignment, Owner, PodResourcesUnavailable

LIST_TIMEOUT_SECONDS = 10.0
"""How long one `List` may take (dcgm-exporter's timeout)."""


class KubeletPodResources:
    """PodResources `List` on the kubelet's unix socket."""

    def __init__(self, socket: Path, *, timeout: float = LIST_TIMEOUT_SECONDS) -> None:
        self.socket = socket
        self._timeout = timeout
        self._target: UnixTarget | None = None
        self._channel: grpc.aio.Channel | None = None

    async def assignments(self) -> tuple[DeviceAssignment, ...]:
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
            DeviceAssignment(
                resource_name=devices.resource_name,
                device_id=device_id,
                owner=Owner(namespace=pod.namespace, pod=pod.name, container=container.name),
            )
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
