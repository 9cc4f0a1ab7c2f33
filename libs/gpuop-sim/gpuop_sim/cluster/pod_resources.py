"""The simulated kubelet's PodResources API (`v1.PodResourcesLister`).

`KubeletGrpc` (gpuop_sim.cluster.kubelet_grpc) serves it on its `pod-resources/kubelet.sock` and
hands it the allocations it made; telemetry lists them to attribute GPUs to pods. The
answers are shaped as the kubelet shapes them: one `ContainerDevices` per device and NUMA
node, with the device ids exactly as the plugin advertised them (`<uuid>::<n>` for a
time-sliced replica), and `GetAllocatableResources` listing every healthy device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import grpc

from gpuop.kubelet import statuses
from gpuop.kubelet.deviceplugin.v1beta1 import api_pb2 as deviceplugin
from gpuop.kubelet.podresources.v1 import api_pb2, api_pb2_grpc


@dataclass(frozen=True)
class Allocation:
    """Devices of one resource given to one container."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    response: deviceplugin.ContainerAllocateResponse
    """What the device plugin answered for the container."""


Allocated = Callable[[], Iterable[tuple[Allocation, Iterable[deviceplugin.Device]]]]
"""Each allocation with the resource's advertised devices (for their topology)."""
Allocatable = Callable[[], Mapping[str, Iterable[deviceplugin.Device]]]
"""Healthy devices by resource."""


class PodResourcesServicer(api_pb2_grpc.PodResourcesListerServicer):
    """Answers from the kubelet's allocations, read anew for every call."""

    def __init__(self, allocated: Allocated, allocatable: Allocatable) -> None:
        self._allocated = allocated
        self._allocatable = allocatable

    async def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        return api_pb2.ListPodResourcesResponse(pod_resources=self._pods())

    async def Get(
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.GetPodResourcesResponse:
        for pod in self._pods():
            if (pod.namespace, pod.name) == (request.pod_namespace, request.pod_name):
                return api_pb2.GetPodResourcesResponse(pod_resources=pod)
        await statuses.abort(
            context,
            grpc.StatusCode.NOT_FOUND,
            f"pod {request.pod_namespace}/{request.pod_name} not found",
        )

    async def GetAllocatableResources(
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.AllocatableResourcesResponse:
        devices = [
            entry
            for resource, advertised in self._allocatable().items()
            for device in advertised
            for entry in _container_devices(resource, device.ID, device)
        ]
        return api_pb2.AllocatableResourcesResponse(devices=devices)

    def _pods(self) -> list[api_pb2.PodResources]:
        pods: dict[tuple[str, str], dict[str, list[api_pb2.ContainerDevices]]] = {}
        for allocation, advertised in self._allocated():
            by_id = {device.ID: device for device in advertised}
            containers = pods.setdefault((allocation.namespace, allocation.pod), {})
            devices = containers.setdefault(allocation.container, [])
            for device_id in allocation.device_ids:
                devices.extend(
                    _container_devices(allocation.resource, device_id, by_id.get(device_id))
                )
        return [
            api_pb2.PodResources(
                name=pod,
                namespace=namespace,
                containers=[
                    api_pb2.ContainerResources(name=name, devices=devices)
                    for name, devices in containers.items()
                ],
            )
            for (namespace, pod), containers in pods.items()
        ]


def _container_devices(
    resource: str, device_id: str, device: deviceplugin.Device | None
) -> list[api_pb2.ContainerDevices]:
    """The kubelet's entries for one device: one per NUMA node, or one without topology."""
    nodes = [] if device is None else [node.ID for node in device.topology.nodes]
    if not nodes:
        return [api_pb2.ContainerDevices(resource_name=resource, device_ids=[device_id])]
    return [
        api_pb2.ContainerDevices(
            resource_name=resource,
            device_ids=[device_id],
            topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=node)]),
        )
        for node in nodes
    ]
