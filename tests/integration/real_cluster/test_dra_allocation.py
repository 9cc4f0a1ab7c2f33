"""gpuop's ResourceSlices on the real control plane: the device plugin's cluster role writes
them for KWOK nodes from their inventories, the real scheduler allocates ResourceClaims made
from templates by the real resourceclaim controller against them (a CEL selector on
`productName` and `memory` lands on the matching GPUs; a device a DeviceTaintRule taints
`NoSchedule` is never allocated), and the role tells the node of the allocation."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuop.bus import InMemoryBus
from gpuop.events import dra as events
from gpuop.events.device_api_commands import DeviceApi, DeviceApiApplied
from gpuop.events.envelope import new_event
from gpuop.events.hardware import Gpu
from gpuop.kube import client, dra, errors
from gpuop.services.device_plugin.cluster.role import DraPublisher, consumer_spec
from tests.support import node_agents
from tests.support.control_plane import ControlPlane
from tests.support.inventories import H200, inventory

pytestmark = [pytest.mark.real_cluster]

H200_NODE, A100_NODE = "gpu-node-2", "gpu-node-1"
"""Two of the session's KWOK nodes (conftest): two H200s on one, a 40 GiB A100 on the other,
whose pool the scheduler tries first (pools go by name), so only the selector avoids it."""
CLASS = "dra-allocation-gpu"
"""NVIDIA's gpu.nvidia.com class under a name of this test's (the chart's tests install that
one)."""
SELECTOR = (
    "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H200') && "
    "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('100Gi')) >= 0"
)


def gpu(minor: int, **changes: Any) -> Gpu:
    return H200.model_copy(
        update={
            "uuid": f"GPU-20bce083-dbf9-2d4f-3c35-c858915acc{minor:02d}",
            "index": minor,
            "minor_number": minor,
            "pci_bus_id": f"0000:00:0{6 + minor}.0",
            **changes,
        }
    )


A100 = gpu(0, model_name="NVIDIA A100-SXM4-40GB", memory_bytes=40 * 1024**3)


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float = 120.0) -> Any:
    async with asyncio.timeout(timeout):
        while not (found := await check()):
            await asyncio.sleep(0.2)
    return found


@pytest.fixture
async def kube(plane: ControlPlane, tmp_path: Path) -> AsyncIterator[client.Kube]:
    async with await client.connect(plane.write_kubeconfig(tmp_path / "kubeconfig")) as kube:
        yield kube


@dataclass
class Published:
    bus: InMemoryBus
    namespace: str
    publisher: DraPublisher


@pytest.fixture
async def published(kube: client.Kube) -> AsyncIterator[Published]:
    """The role running for the two nodes, their pools published; the class and a namespace
    of the test's own made; everything the test made taken away after it."""
    bus = InMemoryBus()
    await bus.start()
    namespace = f"dra-{uuid.uuid4().hex[:8]}"
    for node, gpus in ((H200_NODE, (gpu(0), gpu(1))), (A100_NODE, (A100,))):
        for event in (inventory(gpus=gpus), DeviceApiApplied(api=DeviceApi.DRA, serving=True)):
            await bus.publish(new_event(event, node=node, source="/gpuop/test"))
    publisher = DraPublisher(bus, kube, retry_delay=0.5)
    await publisher.restore()
    subscription = await bus.consume(consumer_spec(bus.prefix, retry_delay=0.5), publisher.handle)
    try:
        await _populate(kube, namespace)
        async with node_agents.running(publisher):
            for node in (H200_NODE, A100_NODE):
                await eventually(lambda n=node: dra.list_slices(kube, driver=events.DRIVER, node=n))
            yield Published(bus, namespace, publisher)
            publisher.slices.nodes.clear()  # it leaves the slices to `_clean`
        await _clean(kube, namespace)
    finally:
        await subscription.stop()
        await bus.close()


async def _populate(kube: client.Kube, namespace: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    await kube.call(kube.core.create_namespace, body)
    expression = (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
    )
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }
    await kube.call(kube.resource.create_device_class, device_class)


async def _clean(kube: client.Kube, namespace: str) -> None:
    await kube.call(kube.core.delete_namespace, namespace)
    for rule in await dra.list_taint_rules(kube):
        await dra.delete_taint_rule(kube, rule["metadata"]["name"])
    await kube.call(kube.resource.delete_device_class, CLASS)
    for node in (H200_NODE, A100_NODE):
        for stale in await dra.list_slices(kube, driver=events.DRIVER, node=node):
            await dra.delete_slice(kube, stale)


async def claim_pod(kube: client.Kube, namespace: str, name: str) -> None:
    """A template asking for one GPU with the CEL selector, and a pod using a claim of it."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": CLASS,
                                "selectors": [{"cel": {"expression": SELECTOR}}],
                            },
                        }
                    ]
                }
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
            "containers": [
                {
                    "name": "main",
                    "image": "example.com/cuda:1",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "tolerations": [{"operator": "Exists"}],
        },
    }
    await kube.call(kube.resource.create_namespaced_resource_claim_template, namespace, template)
    await kube.call(kube.core.create_namespaced_pod, namespace, pod)


async def allocation_of(kube: client.Kube, namespace: str, pod: str) -> list[dict[str, Any]]:
    """The allocation results of the pod's claim, once the scheduler wrote them."""
    read = await kube.call(kube.core.read_namespaced_pod, pod, namespace)
    statuses = (read.get("status") or {}).get("resourceClaimStatuses") or []
    if not statuses or not statuses[0].get("resourceClaimName"):
        return []
    try:
        made = await kube.call(
            kube.resource.read_namespaced_resource_claim,
            statuses[0]["resourceClaimName"],
            namespace,
        )
    except errors.NotFound:
        return []
    return dra.allocation_results(made)


async def unschedulable(kube: client.Kube, namespace: str, pod: str) -> bool:
    read = await kube.call(kube.core.read_namespaced_pod, pod, namespace)
    conditions = (read.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions
    )


@pytest.mark.timeout(300)
async def test_a_cel_claim_lands_on_an_h200_and_its_node_is_told(
    kube: client.Kube, published: Published
) -> None:
    namespace = published.namespace
    await claim_pod(kube, namespace, "h200-a")

    [result] = await eventually(lambda: allocation_of(kube, namespace, "h200-a"))

    assert (result["driver"], result["pool"]) == (events.DRIVER, H200_NODE)
    assert result["device"] in ("gpu-0", "gpu-1")

    async def told() -> list[Any]:
        return await node_agents.published(published.bus, events.ClaimAllocated)

    [(envelope, allocated)] = await eventually(told)
    assert envelope.node == H200_NODE
    # what the API server stored reads as what was sent: syncing again writes nothing
    await published.publisher.slices.sync(H200_NODE)
    [pool] = await dra.list_slices(kube, driver=events.DRIVER, node=H200_NODE)
    assert pool["spec"]["pool"]["generation"] == 1
    assert [(d.device, d.gpu_uuid) for d in allocated.devices] == [
        (result["device"], gpu(int(result["device"][-1])).uuid)
    ]


@pytest.mark.timeout(300)
async def test_a_device_a_taint_rule_taints_is_never_allocated(
    kube: client.Kube, published: Published
) -> None:
    namespace = published.namespace
    rule = dra.taint_rule(
        driver=events.DRIVER, node=H200_NODE, device="gpu-0", key="gpuop.io/quarantine"
    )
    await dra.put_taint_rule(kube, rule)

    await claim_pod(kube, namespace, "h200-b")
    [result] = await eventually(lambda: allocation_of(kube, namespace, "h200-b"))
    await claim_pod(kube, namespace, "h200-c")
    await eventually(lambda: unschedulable(kube, namespace, "h200-c"))

    assert (result["pool"], result["device"]) == (H200_NODE, "gpu-1")
    assert await allocation_of(kube, namespace, "h200-c") == []
