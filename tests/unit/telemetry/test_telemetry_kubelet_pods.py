"""The PodResources client on a real gRPC unix socket, served by the simulated kubelet's
servicer: what it decodes, and how a missing socket, an error answer and a restarted kubelet
are reported."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gpuop.kubelet.deviceplugin.v1beta1 import api_pb2 as deviceplugin
from gpuop.kubelet.podresources.v1 import api_pb2, api_pb2_grpc
from gpuop.kubelet.sockets import UnixTarget
from gpuop.services.telemetry.config import load_config
from gpuop.services.telemetry.kubelet_pods import KubeletPodResources
from gpuop.services.telemetry.pods import DeviceAssignment, Owner, PodResourcesUnavailable
from gpuop_sim.cluster.pod_resources import Allocation, PodResourcesServicer

UUID = "GPU-20bce083-dbf9-2d4f-3c35-c858915accc5"


def allocation(pod: str, resource: str, *ids: str, container: str = "main") -> Allocation:
    return Allocation("ml", pod, container, resource, ids, deviceplugin.ContainerAllocateResponse())


@pytest.fixture
def socket(tmp_path: Path) -> Path:
    # past the 107 bytes of a unix socket path, as deep host roots in tests and the demo are
    deep = tmp_path / ("host-root-" + "x" * 60) / "var/lib/kubelet/pod-resources"
    deep.mkdir(parents=True)
    return deep / "kubelet.sock"


class Kubelet:
    """A PodResources server on `socket`, started and stopped by the test."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self._running: tuple[grpc.aio.Server, UnixTarget] | None = None

    async def serve(self, servicer: api_pb2_grpc.PodResourcesListerServicer) -> None:
        server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
        target = UnixTarget(self.socket)
        server.add_insecure_port(target.address)
        await server.start()
        self._running = (server, target)

    async def stop(self) -> None:
        if self._running is not None:
            server, target = self._running
            self._running = None
            await server.stop(None)
            target.close()
            await asyncio.to_thread(self.socket.unlink, missing_ok=True)


@pytest.fixture
async def kubelet(socket: Path) -> AsyncIterator[Kubelet]:
    served = Kubelet(socket)
    yield served
    await served.stop()


def listing(allocations: list[Allocation]) -> PodResourcesServicer:
    return PodResourcesServicer(lambda: [(a, ()) for a in allocations], dict)


async def test_list_answers_become_device_assignments(kubelet: Kubelet, socket: Path) -> None:
    allocations = [
        allocation("trainer-0", "nvidia.com/gpu", UUID),
        allocation("notebook", "nvidia.com/gpu", f"{UUID}::1", f"{UUID}::2", container="lab"),
        allocation("trainer-0", "rdma/rdma_shared_device_a", "rdma0"),
    ]
    await kubelet.serve(listing(allocations))
    client = KubeletPodResources(socket)

    try:
        found = await client.assignments()
    finally:
        await client.close()

    trainer, notebook = Owner("ml", "trainer-0", "main"), Owner("ml", "notebook", "lab")
    assert sorted(found, key=lambda a: (a.owner, a.device_id)) == sorted(
        [
            DeviceAssignment("nvidia.com/gpu", UUID, trainer),
            DeviceAssignment("rdma/rdma_shared_device_a", "rdma0", trainer),
            DeviceAssignment("nvidia.com/gpu", f"{UUID}::1", notebook),
            DeviceAssignment("nvidia.com/gpu", f"{UUID}::2", notebook),
        ],
        key=lambda a: (a.owner, a.device_id),
    )


async def test_the_socket_is_found_in_the_kubelet_root_dir_the_config_names(
    tmp_path: Path,
) -> None:
    host = tmp_path / "host"
    socket = host / "data/kubelet/pod-resources/kubelet.sock"
    socket.parent.mkdir(parents=True)
    kubelet = Kubelet(socket)
    await kubelet.serve(listing([allocation("trainer-0", "nvidia.com/gpu", UUID)]))
    path = tmp_path / "telemetry.yaml"
    path.write_text("kubelet_root_dir: /data/kubelet/\n", encoding="utf-8")
    moved, default = load_config(path), load_config(None)
    client = KubeletPodResources(moved.socket_under(host))
    at_default = KubeletPodResources(default.socket_under(host))

    try:
        found = await client.assignments()
        with pytest.raises(PodResourcesUnavailable, match="no kubelet PodResources socket"):
            await at_default.assignments()
    finally:
        await client.close()
        await at_default.close()
        await kubelet.stop()

    assert moved.socket_under(host) == socket
    assert [a.owner.pod for a in found] == ["trainer-0"]


async def test_a_missing_socket_says_to_mount_the_directory(tmp_path: Path) -> None:
    client = KubeletPodResources(tmp_path / "var/lib/kubelet/pod-resources/kubelet.sock")

    with pytest.raises(PodResourcesUnavailable, match="pod-resources directory mounted"):
        await client.assignments()


class Refusing(PodResourcesServicer):
    def __init__(self) -> None:
        super().__init__(list, dict)

    async def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rate limited")
        raise AssertionError("abort returns no answer")


async def test_an_error_answer_is_reported_with_its_code(kubelet: Kubelet, socket: Path) -> None:
    await kubelet.serve(Refusing())
    client = KubeletPodResources(socket)

    with pytest.raises(PodResourcesUnavailable, match="RESOURCE_EXHAUSTED: rate limited"):
        await client.assignments()
    await client.close()


async def test_a_restarted_kubelet_is_reached_again(kubelet: Kubelet, socket: Path) -> None:
    servicer = listing([allocation("trainer-0", "nvidia.com/gpu", UUID)])
    await kubelet.serve(servicer)
    client = KubeletPodResources(socket, timeout=2.0)
    assert len(await client.assignments()) == 1

    await kubelet.stop()
    with pytest.raises(PodResourcesUnavailable):
        await client.assignments()
    await kubelet.serve(servicer)

    try:
        assert len(await client.assignments()) == 1
    finally:
        await client.close()
