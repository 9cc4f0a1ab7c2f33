"""Allocate as a plugin server answers it, without the socket: answers kept per request, and
dropped whenever the resource they came from is replaced (devices, sharing, device list
strategies), never for a change of health alone."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from gpuop.host.roots import HostRoot
from gpuop.kubelet import constants
from gpuop.kubelet.deviceplugin.v1beta1 import api_pb2
from gpuop.services.device_plugin import cdi, serving
from gpuop.services.device_plugin.config import DevicePluginConfig
from gpuop.services.device_plugin.inventory import GpuInventory
from gpuop.services.device_plugin.metrics import PluginMetrics
from gpuop.services.device_plugin.resources import GpuResource, gpu_resources
from gpuop.services.device_plugin.serving import PluginServer
from tests.support.device_plugin import config, sim_inventory, strategies


class Refused(Exception):
    """What `RefusingContext.abort` raises, as gRPC ends a handler that aborts."""


class RefusingContext:
    """The part of a servicer context Allocate uses: `abort` ends the call."""

    def __init__(self) -> None:
        self.aborted: list[tuple[grpc.StatusCode, str]] = []

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted.append((code, details))
        raise Refused(details)


@pytest.fixture
def inventory(tmp_path: Path) -> GpuInventory:
    return sim_inventory(HostRoot(tmp_path), gpus=4)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def gpus(inventory: GpuInventory, under: DevicePluginConfig) -> GpuResource:
    (resource,) = gpu_resources(inventory, under).resources
    return resource


def server_of(resource: GpuResource, registry: CollectorRegistry, tmp_path: Path) -> PluginServer:
    return PluginServer(resource, (), tmp_path, PluginMetrics(registry))


def request(*containers: list[str]) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in containers]
    )


def allocations(registry: CollectorRegistry, outcome: str) -> float | None:
    return registry.get_sample_value(
        "gpuop_device_plugin_allocations_total",
        {"resource": "nvidia.com/gpu", "outcome": outcome},
    )


async def test_a_repeated_request_gets_the_answer_kept_and_is_counted_each_time(
    inventory: GpuInventory, registry: CollectorRegistry, tmp_path: Path
) -> None:
    resource = gpus(inventory, config())
    server = server_of(resource, registry, tmp_path)
    ids = [resource.devices[1].id, resource.devices[0].id]
    first = await server.Allocate(request(ids, [ids[0]]), None)
    again = await server.Allocate(request(ids, [ids[0]]), None)
    assert again is first
    assert list(first.container_responses) == [resource.allocate(ids), resource.allocate(ids[:1])]
    assert first.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids)
    assert allocations(registry, "ok") == 2


async def test_the_same_ids_in_another_order_are_another_request(
    inventory: GpuInventory, registry: CollectorRegistry, tmp_path: Path
) -> None:
    resource = gpus(inventory, config())
    server = server_of(resource, registry, tmp_path)
    ids = [resource.devices[0].id, resource.devices[1].id]
    await server.Allocate(request(ids), None)
    reversed_ = await server.Allocate(request(ids[::-1]), None)
    assert reversed_.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids[::-1])


async def test_a_new_device_list_strategy_replaces_the_answers_for_the_same_ids(
    inventory: GpuInventory, registry: CollectorRegistry, tmp_path: Path
) -> None:
    server = server_of(gpus(inventory, config()), registry, tmp_path)
    gpu = inventory.gpus[0].whole.uuid
    before = await server.Allocate(request([gpu]), None)
    assert dict(before.container_responses[0].envs) == {"NVIDIA_VISIBLE_DEVICES": gpu}

    await server.advertise(gpus(inventory, strategies("cdi")), ())
    after = (await server.Allocate(request([gpu]), None)).container_responses[0]
    assert dict(after.envs) == {}
    assert [d.name for d in after.cdi_devices] == [f"{cdi.KIND}={gpu}"]


async def test_a_new_sharing_config_replaces_the_answers(
    inventory: GpuInventory, registry: CollectorRegistry, tmp_path: Path
) -> None:
    def shared(strategy: str) -> GpuResource:
        sharing = {strategy: {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}
        return gpus(inventory, config({"sharing": sharing}))

    server = server_of(shared("timeSlicing"), registry, tmp_path)
    replica = f"{inventory.gpus[0].whole.uuid}::1"
    sliced = (await server.Allocate(request([replica]), None)).container_responses[0]
    assert "CUDA_MPS_PIPE_DIRECTORY" not in sliced.envs

    await server.advertise(shared("mps"), ())
    mps = (await server.Allocate(request([replica]), None)).container_responses[0]
    assert "CUDA_MPS_PIPE_DIRECTORY" in mps.envs
    assert mps.envs["NVIDIA_VISIBLE_DEVICES"] == inventory.gpus[0].whole.uuid


async def test_new_devices_replace_the_answers(tmp_path: Path, registry: CollectorRegistry) -> None:
    four = gpus(sim_inventory(HostRoot(tmp_path), gpus=4), config())
    server = server_of(four, registry, tmp_path)
    kept, gone = four.devices[0].id, four.devices[3].id
    for gpu in (kept, gone):
        await server.Allocate(request([gpu]), None)

    await server.advertise(gpus(sim_inventory(HostRoot(tmp_path), gpus=2), config()), ())
    answer = (await server.Allocate(request([kept]), None)).container_responses[0]
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == kept
    with pytest.raises(Refused, match="unknown device id"):
        await server.Allocate(request([gone]), RefusingContext())


async def test_a_change_of_health_alone_keeps_the_answers(
    inventory: GpuInventory, registry: CollectorRegistry, tmp_path: Path
) -> None:
    resource = gpus(inventory, config())
    server = server_of(resource, registry, tmp_path)
    gpu = resource.devices[0].id
    before = await server.Allocate(request([gpu]), None)
    unhealthy = tuple(api_pb2.Device(ID=d.id, health=constants.UNHEALTHY) for d in resource.devices)
    assert await server.advertise(resource, unhealthy)
    assert await server.Allocate(request([gpu]), None) is before


async def test_a_refusal_is_not_kept(
    inventory: GpuInventory, registry: CollectorRegistry, tmp_path: Path
) -> None:
    server = server_of(gpus(inventory, config()), registry, tmp_path)
    context = RefusingContext()
    for _ in range(2):
        with pytest.raises(Refused):
            await server.Allocate(request(["GPU-nowhere"]), context)
    assert [code for code, _ in context.aborted] == [grpc.StatusCode.INVALID_ARGUMENT] * 2
    assert allocations(registry, "refused") == 2


async def test_requests_past_the_number_kept_are_answered_all_the_same(
    inventory: GpuInventory,
    registry: CollectorRegistry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(serving, "KEPT_ANSWERS", 2)
    resource = gpus(inventory, config())
    server = server_of(resource, registry, tmp_path)
    for _ in range(2):
        for device in resource.devices:
            answer = await server.Allocate(request([device.id]), None)
            assert list(answer.container_responses) == [resource.allocate([device.id])]
