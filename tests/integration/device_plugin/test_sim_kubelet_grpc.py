"""The simulated kubelet behaves as the real one toward plugins and PodResources clients:
it refuses bad registrations, cleans its directory on restart, and lists allocations."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gpuop.host.roots import HostRoot
from gpuop.kubelet import constants
from gpuop.kubelet.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from gpuop.kubelet.podresources.v1 import api_pb2 as podresources
from gpuop.kubelet.podresources.v1 import api_pb2_grpc as podresources_grpc
from gpuop.kubelet.sockets import UnixTarget
from gpuop_sim.cluster.kubelet_grpc import KubeletError, KubeletGrpc
from tests.support.kubelet_plugin import GPU, build_host, healthy, running_node


@pytest.fixture
def host(tmp_path: Path) -> HostRoot:
    return build_host(tmp_path / "host", 2)


@pytest.fixture
async def kubelet(host: HostRoot) -> AsyncIterator[KubeletGrpc]:
    async with KubeletGrpc.under(host.path) as running:
        yield running


async def register(kubelet: KubeletGrpc, **fields: str) -> None:
    request = api_pb2.RegisterRequest(
        version=fields.get("version", "v1beta1"),
        endpoint=fields.get("endpoint", "absent.sock"),
        resource_name=fields.get("resource_name", "example.com/thing"),
    )
    with UnixTarget(kubelet.kubelet_socket) as target:
        async with grpc.aio.insecure_channel(target.address) as channel:
            await api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=5)


@pytest.mark.parametrize(
    ("fields", "code", "words"),
    [
        ({"version": "v1alpha"}, grpc.StatusCode.INVALID_ARGUMENT, "unsupported"),
        ({"resource_name": "gpu"}, grpc.StatusCode.INVALID_ARGUMENT, "needs a domain"),
        ({"resource_name": "kubernetes.io/gpu"}, grpc.StatusCode.INVALID_ARGUMENT, "kubernetes.io"),
        ({"endpoint": "../x.sock"}, grpc.StatusCode.INVALID_ARGUMENT, "invalid endpoint"),
        ({}, grpc.StatusCode.UNAVAILABLE, "cannot reach the plugin"),
    ],
)
async def test_a_bad_registration_is_refused(
    kubelet: KubeletGrpc, fields: dict[str, str], code: grpc.StatusCode, words: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await register(kubelet, **fields)
    assert refused.value.code() is code
    assert words in (refused.value.details() or "")
    assert kubelet.registrations == []


async def test_a_restart_cleans_the_directory_but_keeps_the_checkpoint(
    kubelet: KubeletGrpc,
) -> None:
    directory = kubelet.device_plugin_dir
    (directory / constants.CHECKPOINT).write_text("{}")
    (directory / "stale.sock").touch()
    (directory / "subdir").mkdir()
    before = kubelet.kubelet_socket.stat().st_ino, kubelet.kubelet_socket.stat().st_ctime_ns
    await kubelet.restart()
    assert {p.name for p in directory.iterdir()} == {
        constants.CHECKPOINT,
        constants.KUBELET_SOCKET,
        "subdir",
    }
    after = kubelet.kubelet_socket.stat().st_ino, kubelet.kubelet_socket.stat().st_ctime_ns
    assert after != before


async def test_allocating_for_an_unregistered_resource_says_what_is_registered(
    kubelet: KubeletGrpc,
) -> None:
    with pytest.raises(KubeletError, match=r"no device plugin registered for nvidia.com/gpu"):
        await kubelet.allocate(GPU, ["GPU-1"], pod="p")


async def test_pod_resources_lists_the_allocations(host: HostRoot) -> None:
    async with running_node(host, gpus=2) as node:
        devices = await node.kubelet.wait_for_devices(GPU, healthy(2))
        await node.kubelet.allocate(GPU, [devices[1].ID], pod="trainer", namespace="ml")
        await node.kubelet.allocate(GPU, [devices[0].ID], pod="sidecar", container="side")
        with UnixTarget(node.kubelet.pod_resources_socket) as target:
            async with grpc.aio.insecure_channel(target.address) as channel:
                lister = podresources_grpc.PodResourcesListerStub(channel)
                listed = await lister.List(podresources.ListPodResourcesRequest())
                one = await lister.Get(
                    podresources.GetPodResourcesRequest(pod_name="trainer", pod_namespace="ml")
                )
                allocatable = await lister.GetAllocatableResources(
                    podresources.AllocatableResourcesRequest()
                )
                with pytest.raises(grpc.aio.AioRpcError) as missing:
                    await lister.Get(
                        podresources.GetPodResourcesRequest(pod_name="gone", pod_namespace="ml")
                    )
                node.kubelet.release_pod("ml", "trainer")
                after = await lister.List(podresources.ListPodResourcesRequest())
    assert [(p.namespace, p.name) for p in listed.pod_resources] == [
        ("ml", "trainer"),
        ("default", "sidecar"),
    ]
    (container,) = one.pod_resources.containers
    assert container.name == "main"
    (devices_of_trainer,) = container.devices
    assert devices_of_trainer.resource_name == GPU
    assert list(devices_of_trainer.device_ids) == [devices[1].ID]
    assert [n.ID for n in devices_of_trainer.topology.nodes] == [1]
    assert sorted(d.device_ids[0] for d in allocatable.devices) == sorted(d.ID for d in devices)
    assert missing.value.code() is grpc.StatusCode.NOT_FOUND
    assert [p.name for p in after.pod_resources] == ["sidecar"]
