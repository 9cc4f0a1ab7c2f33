"""The kubelet's answer to "who holds which device", as telemetry's `pods` reads it.

`KubeletPodResources` is the `pods.PodResourcesSource` of a real node (and of the simulated
kubelet, which serves the same API): the PodResources client the device plugin uses too
(`gpuop.kubelet.allocations`, which keeps one gRPC channel on the socket and reaches a
restarted kubelet again), its allocations told as the devices each container owns.
"""

from __future__ import annotations

from pathlib import Path

from gpuop.kubelet import allocations
from gpuop.services.telemetry.pods import DeviceAssignment, Owner


class KubeletPodResources:
    """PodResources `List` on the kubelet's unix socket; a `pods.PodResourcesSource`."""

    def __init__(self, socket: Path, *, timeout: float = allocations.LIST_TIMEOUT_SECONDS) -> None:
        self.socket = socket
        self._kubelet = allocations.KubeletPodResources(socket, timeout=timeout)

    async def assignments(self) -> tuple[DeviceAssignment, ...]:
        return tuple(
            DeviceAssignment(
                resource_name=allocation.resource_name,
                device_id=allocation.device_id,
                owner=Owner(
                    namespace=allocation.namespace,
                    pod=allocation.pod,
                    container=allocation.container,
                ),
            )
            for allocation in await self._kubelet.allocations()
        )

    async def close(self) -> None:
        await self._kubelet.close()
