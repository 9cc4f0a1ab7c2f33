"""GPUs through DRA on the real node: gpuop's DRA kubelet plugin (`DraPlugin`, in this
process, on the real node's host root) is registered by the real kubelet through its
`plugins_registry`; the real scheduler allocates a ResourceClaim against a ResourceSlice
the test writes for the node (as the device plugin's cluster role will), and the test hands
the plugin the claim's allocation as the cluster role publishes it (`dra.ClaimAllocated`).
The real kubelet prepares the claim, containerd injects the claim's CDI devices, and the
container lists exactly its GPU's device node; a plugin restart while the pod runs loses
no prepared claim, and the pod's deletion makes the kubelet unprepare it, which removes the
claim's CDI spec."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

import pytest

from gpuop.events import dra
from gpuop.host.roots import HostRoot
from gpuop.nvml import open_backend
from gpuop.nvml.protocol import opened
from gpuop.services.device_plugin.dra import cdispecs
from gpuop.services.device_plugin.dra.plugin import DraPlugin
from gpuop.services.device_plugin.health import HealthBook
from gpuop.services.device_plugin.inventory import GpuInventory, read_inventory
from tests.integration.real_node.conftest import GPUS
from tests.support.node_pods import pod, running
from tests.support.real_node import RealNode
from tests.support.waiting import eventually

pytestmark = [pytest.mark.real_node]

WAIT = {"timeout": 120, "interval": 0.5}
RESOURCE = "/apis/resource.k8s.io/v1"
CLAIM = "gpu-claim"
CLASS = "gpu.nvidia.com"
LISTING = "ls -l /dev | grep nvidia; echo done; "


def inventory_of(node: RealNode) -> GpuInventory:
    """The node's GPUs as its device plugin reads them (`--nvml sim:8`)."""
    nvml = open_backend(f"sim:{GPUS}", host_root=node.host_root, node=node.name)
    with opened(nvml):
        return read_inventory(nvml, HostRoot(node.host_root))


@contextlib.contextmanager
def kubelet_dirs(node: RealNode) -> Iterator[None]:
    """The kubelet's plugin directories (under its `--root-dir`) where the host root has
    them, as on a node whose kubelet runs with the default root."""
    links = []
    for name in ("plugins_registry", "plugins"):
        link = node.host_root / "var/lib/kubelet" / name
        (node.kubelet_root / name).mkdir(parents=True, exist_ok=True)
        link.symlink_to(node.kubelet_root / name)
        links.append(link)
    try:
        yield
    finally:
        for link in links:
            link.unlink()


async def started(node: RealNode, inventory: GpuInventory, answers: list[bool]) -> DraPlugin:
    """A DRA plugin instance on the node, as a new pod of the DaemonSet starts one; the
    kubelet's registration answers go to `answers`."""
    plugin = DraPlugin(
        HostRoot(node.host_root),
        node.name,
        lambda: inventory,
        HealthBook(()),
        on_registration=lambda registered, error: answers.append(registered),
        seen_as=PurePosixPath(node.host_root),  # the kubelet dials the socket there
    )
    await plugin.start()
    return plugin


def resource_slice(node: RealNode, inventory: GpuInventory) -> dict[str, Any]:
    """The node's pool, as the cluster role publishes it (its relevant part)."""
    devices = [
        {
            "name": f"gpu-{gpu.whole.device_nodes[0].removeprefix('/dev/nvidia')}",
            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": gpu.whole.uuid}},
        }
        for gpu in inventory.gpus
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node.name}-{dra.DRIVER}"},
        "spec": {
            "driver": dra.DRIVER,
            "nodeName": node.name,
            "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def device_class() -> dict[str, Any]:
    expression = f"device.driver == '{dra.DRIVER}'"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def resource_claim() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": CLAIM, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}},
    }


def claim_pod(name: str) -> dict[str, Any]:
    manifest = pod(name, LISTING, resourceClaims=[{"name": "gpu", "resourceClaimName": CLAIM}])
    manifest["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return manifest


def allocation(claim: dict[str, Any], inventory: GpuInventory) -> dra.ClaimAllocated | None:
    """What the cluster role publishes for an allocated, reserved claim; None before."""
    status = claim.get("status", {})
    results = status.get("allocation", {}).get("devices", {}).get("results", [])
    if not results or not status.get("reservedFor"):
        return None
    uuids = {
        f"gpu-{g.whole.device_nodes[0].removeprefix('/dev/nvidia')}": g.whole.uuid
        for g in inventory.gpus
    }
    meta = claim["metadata"]
    return dra.ClaimAllocated(
        claim=dra.ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"]),
        devices=tuple(
            dra.AllocatedDevice(
                request=r["request"],
                driver=r["driver"],
                pool=r["pool"],
                device=r["device"],
                gpu_uuid=uuids[r["device"]],
            )
            for r in results
        ),
        pods=tuple(
            dra.PodRef(namespace="default", name=p["name"], uid=p["uid"])
            for p in status["reservedFor"]
        ),
        resource_version=meta["resourceVersion"],
    )


async def publish_allocation(
    node: RealNode, plugin_of: list[DraPlugin], inventory: GpuInventory
) -> dra.ClaimAllocated:
    """Act as the cluster role: once the scheduler allocated the claim, hand it over."""
    path = f"{RESOURCE}/namespaces/default/resourceclaims/{CLAIM}"
    fact = await eventually(lambda: allocation(node.plane.call("GET", path), inventory), **WAIT)
    plugin_of[-1].index.apply(fact)
    return fact


async def test_the_real_kubelet_prepares_a_claim_and_the_container_sees_its_gpu(
    node: RealNode,
) -> None:
    inventory = await asyncio.to_thread(inventory_of, node)
    answers: list[bool] = []
    objects = [
        (f"{RESOURCE}/deviceclasses", device_class(), CLASS),
        (f"{RESOURCE}/resourceslices", resource_slice(node, inventory), f"{node.name}-{CLASS}"),
        (f"{RESOURCE}/namespaces/default/resourceclaims", resource_claim(), CLAIM),
    ]
    with kubelet_dirs(node):
        plugins = [await started(node, inventory, answers)]
        try:
            await eventually(lambda: answers and answers[-1], **WAIT)
            for path, body, _ in objects:
                node.plane.call("POST", path, body)
            feeding = asyncio.create_task(publish_allocation(node, plugins, inventory))
            async with running(node, claim_pod("dra")) as current:
                fact = await feeding
                log = current["log"]
                (container,) = node.crictl("ps", "--name", "main", "--quiet").stdout.split()
                inspected = json.loads(node.crictl("inspect", container).stdout)
                spec = cdispecs.spec_path(HostRoot(node.host_root), fact.claim.uid)
                assert spec.exists()

                # the plugin restarts while the pod runs: a new instance, registered anew,
                # that knows the claim only from the checkpoint
                await plugins[-1].stop()
                count = len(answers)
                plugins.append(await started(node, inventory, answers))
                await eventually(lambda: len(answers) > count and answers[-1], **WAIT)
                assert spec.exists(), "the restart removed nothing"
            # the pod is gone: the kubelet unprepared the claim at the restarted instance
            await eventually(lambda: not spec.exists(), **WAIT)
        finally:
            await plugins[-1].stop()
            for path, _, name in reversed(objects):
                node.plane.request(f"{path}/{name}", method="DELETE")

    device = fact.devices[0].device
    gpu_nodes = re.findall(r" (nvidia\d+)$", log, re.MULTILINE)
    assert gpu_nodes == [f"nvidia{device.removeprefix('gpu-')}"], log
    names = [d["name"] for d in inspected["info"]["config"]["CDI_devices"]]
    assert names == [f"k8s.gpu.nvidia.com/claim={fact.claim.uid}-{device}"], names
