"""The cluster role tells each node which ResourceClaims hold its GPUs: `ClaimAllocated` for
gpuop's own devices and for another driver's devices that name a GPU of the node, again when
the claim's pods change, `ClaimReleased` when the claim is deallocated or deleted (also while
the role was down), opaque configurations passed through as they are."""

from __future__ import annotations

import asyncio
from typing import Any

from gpuop.bus import InMemoryBus
from gpuop.events import dra as events
from gpuop.kube import client, dra
from tests.integration.device_plugin_cluster.conftest import NODE, Running, eventually
from tests.support.inventories import H200
from tests.support.node_agents import published

CLAIMS = "default"
MERGE = "application/merge-patch+json"
RESOURCE = {"apiVersion": "resource.k8s.io/v1"}
POD = {"resource": "pods", "name": "train-0", "uid": "0b4e0a39-58b1-4d0b-8f5e-2f4c6b8d9e01"}
OTHER_POD = {"resource": "pods", "name": "train-1", "uid": "0b4e0a39-58b1-4d0b-8f5e-2f4c6b8d9e02"}


def result(device: str = "gpu-0", driver: str = events.DRIVER, pool: str = NODE) -> dict[str, Any]:
    return {"request": "gpu", "driver": driver, "pool": pool, "device": device}


async def claim(
    kube: client.Kube,
    name: str,
    results: list[dict[str, Any]],
    *,
    pods: list[dict[str, Any]] = (),  # type: ignore[assignment]
    config: list[dict[str, Any]] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    body = {
        **RESOURCE,
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
            }
        },
    }
    await kube.call(kube.resource.create_namespaced_resource_claim, CLAIMS, body)
    return await allocate(kube, name, results, pods=pods, config=config)


async def allocate(
    kube: client.Kube,
    name: str,
    results: list[dict[str, Any]] | None,
    *,
    pods: list[dict[str, Any]] = (),  # type: ignore[assignment]
    config: list[dict[str, Any]] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    allocation = (
        None if results is None else {"devices": {"results": results, "config": list(config)}}
    )
    status = {"allocation": allocation, "reservedFor": list(pods) or None}
    return await kube.call(
        kube.resource.patch_namespaced_resource_claim_status,
        name,
        CLAIMS,
        {"status": status},
        _content_type=MERGE,
    )


async def told(bus: InMemoryBus, count: int) -> list[tuple[str, Any]]:
    async def enough() -> bool:
        return len(await _dra_events(bus)) >= count

    await eventually(enough)
    await asyncio.sleep(0.1)  # nothing more comes
    return await _dra_events(bus)


async def _dra_events(bus: InMemoryBus) -> list[tuple[str, Any]]:
    found = await published(bus, events.ClaimAllocated) + await published(bus, events.ClaimReleased)
    found.sort(key=lambda item: item[0].time)
    return [(envelope.node, payload) for envelope, payload in found]


async def test_an_allocation_of_gpuops_device_is_told_to_its_node_and_again_per_pod_change(
    bus: InMemoryBus, kube: client.Kube, running: Running, serving_node: str
) -> None:
    async with running():
        made = await claim(kube, "train", [result()], pods=[POD])
        [(node, first)] = await told(bus, 1)

        await allocate(kube, "train", [result()], pods=[POD, OTHER_POD])
        second = (await told(bus, 2))[1][1]
        await kube.call(kube.resource.delete_namespaced_resource_claim, "train", CLAIMS)
        third = (await told(bus, 3))[2][1]

    assert node == NODE
    assert first.claim.uid == made["metadata"]["uid"]
    [device] = first.devices
    assert (device.device, device.gpu_uuid, device.mig_uuid) == ("gpu-0", H200.uuid, None)
    assert [pod.name for pod in first.pods] == ["train-0"]
    assert [pod.name for pod in second.pods] == ["train-0", "train-1"]
    assert isinstance(third, events.ClaimReleased) and third.deleted


async def test_a_deallocated_claim_is_released_and_a_status_write_alone_tells_nothing(
    bus: InMemoryBus, kube: client.Kube, running: Running, serving_node: str
) -> None:
    async with running():
        await claim(kube, "train", [result()], pods=[POD])
        await told(bus, 1)
        # the same allocation and pods at a new resourceVersion: nothing to tell
        await kube.call(
            kube.resource.patch_namespaced_resource_claim,
            "train",
            CLAIMS,
            {"metadata": {"labels": {"touched": "yes"}}},
            _content_type=MERGE,
        )
        await allocate(kube, "train", None)
        found = await told(bus, 2)

    assert len(found) == 2
    released = found[1][1]
    assert isinstance(released, events.ClaimReleased) and not released.deleted


async def test_another_drivers_device_is_matched_to_the_gpu_by_its_pci_address(
    bus: InMemoryBus, kube: client.Kube, running: Running, serving_node: str
) -> None:
    foreign = {
        **RESOURCE,
        "kind": "ResourceSlice",
        "metadata": {"name": "other-node-1"},
        "spec": {
            "driver": "gpu.example.com",
            "pool": {"name": "pool-a", "generation": 1, "resourceSliceCount": 1},
            "nodeName": NODE,
            "devices": [
                {
                    "name": "dev-0",
                    "attributes": {"resource.kubernetes.io/pciBusID": {"string": "0000:00:06.0"}},
                },
                {
                    "name": "dev-1",
                    "attributes": {"uuid": {"string": "GPU-00000000-0000-0000-0000-000000000000"}},
                },
            ],
        },
    }
    await dra.create_slice(kube, foreign)
    async with running():
        await claim(
            kube,
            "foreign",
            [
                result("dev-0", "gpu.example.com", "pool-a"),
                result("dev-1", "gpu.example.com", "pool-a"),
            ],
        )
        [(node, allocated)] = await told(bus, 1)

    assert node == NODE
    assert [(d.device, d.gpu_uuid) for d in allocated.devices] == [
        ("dev-0", H200.uuid),
        ("dev-1", None),
    ]


async def test_another_drivers_device_no_slice_lists_is_told_to_nobody(
    bus: InMemoryBus, kube: client.Kube, running: Running, serving_node: str
) -> None:
    async with running():
        await claim(kube, "elsewhere", [result("dev-0", "gpu.example.com", "pool-z")])
        await claim(kube, "here", [result()])
        found = await told(bus, 1)

    assert [payload.claim.name for _, payload in found] == ["here"]


async def test_a_claim_deleted_while_the_role_was_down_is_released_on_restart(
    bus: InMemoryBus, kube: client.Kube, running: Running, serving_node: str
) -> None:
    async with running():
        await claim(kube, "train", [result()], pods=[POD])
        await claim(kube, "kept", [result()], pods=[OTHER_POD])
        await told(bus, 2)
    await kube.call(kube.resource.delete_namespaced_resource_claim, "train", CLAIMS)

    async with running():
        found = await told(bus, 3)

    assert len(found) == 3  # `kept`, unchanged, is not told again
    node, released = found[2]
    assert node == NODE
    assert isinstance(released, events.ClaimReleased)
    assert (released.claim.name, released.deleted) == ("train", True)


async def test_opaque_configurations_pass_through_even_ones_the_node_will_refuse(
    bus: InMemoryBus, kube: client.Kube, running: Running, serving_node: str
) -> None:
    bogus = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "Bogus"},
    }
    config = [
        {
            "source": "FromClass",
            "opaque": {"driver": events.DRIVER, "parameters": {"kind": "GpuConfig"}},
        },
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": {"driver": events.DRIVER, "parameters": bogus},
        },
        {"source": "FromClaim", "opaque": {"driver": "other.example.com", "parameters": {"x": 1}}},
    ]
    async with running():
        await claim(kube, "shared", [result()], config=config)
        [(_, allocated)] = await told(bus, 1)

    assert [(c.source, c.requests, c.parameters) for c in allocated.configs] == [
        (events.ConfigSource.CLASS, (), {"kind": "GpuConfig"}),
        (events.ConfigSource.CLAIM, ("gpu",), bogus),
    ]


async def test_a_claim_the_events_cannot_carry_does_not_stop_the_others(
    bus: InMemoryBus, kube: client.Kube, running: Running, serving_node: str
) -> None:
    async with running():
        await claim(kube, "too-many", [result() for _ in range(33)])  # the API allows 32
        await claim(kube, "fine", [result()])
        found = await told(bus, 1)

    assert [payload.claim.name for _, payload in found] == ["fine"]
