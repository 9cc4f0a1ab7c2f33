"""`ListGpuHolders` on the bus, answered by the device plugin from the simulated kubelet's
PodResources over its real unix socket: the pods the kubelet admitted onto the GPUs, under
time-slicing and MIG, and `GpuHoldersUnknown` while the kubelet is down."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.events import dra, remediation_commands
from gpuop.events.fields import NamespacedName
from gpuop.host.roots import HostRoot
from gpuop_sim.nvml import sim_gpus
from tests.support.device_plugin import config
from tests.support.kubelet_plugin import GPU, NODE, build_host, healthy, running_node, sim_nvml


@pytest.fixture
def host(tmp_path: Path) -> HostRoot:
    return build_host(tmp_path / "host", 8)


def gpu(index: int) -> str:
    return sim_gpus.gpu_uuid(NODE, index)


async def test_the_pods_on_time_sliced_replicas_of_a_gpu_are_its_holders(host: HostRoot) -> None:
    document = {"sharing": {"timeSlicing": {"resources": [{"name": GPU, "replicas": 4}]}}}
    async with running_node(host, config=config(document)) as node:
        await node.kubelet.wait_for_devices(GPU, healthy(32))
        await node.kubelet.allocate(GPU, [f"{gpu(3)}::0"], pod="trainer-0", namespace="ml")
        await node.kubelet.allocate(GPU, [f"{gpu(3)}::2", f"{gpu(4)}::1"], pod="trainer-1")
        await node.kubelet.allocate(GPU, [f"{gpu(5)}::0"], pod="other", namespace="ml")

        await node.command(remediation_commands.ListGpuHolders(gpu_uuids=(gpu(3),)), "holders")
        (answer,) = await node.confirmations(remediation_commands.GpuHoldersListed)

    assert answer.gpu_uuids == (gpu(3),)
    assert answer.pods == (
        NamespacedName(namespace="default", name="trainer-1"),
        NamespacedName(namespace="ml", name="trainer-0"),
    )


async def test_the_pods_on_mig_devices_of_a_gpu_are_its_holders(host: HostRoot) -> None:
    nvml = sim_nvml(host, 8)
    nvml.enable_mig(2, ["3g.71gb", "3g.71gb"])
    resource = "nvidia.com/mig-3g.71gb"
    async with running_node(
        host, config=config({"flags": {"migStrategy": "mixed"}}), nvml=nvml
    ) as node:
        devices = await node.kubelet.wait_for_devices(resource, healthy(2))
        await node.kubelet.allocate(resource, [devices[1].ID], pod="inference", namespace="ml")

        await node.command(
            remediation_commands.ListGpuHolders(gpu_uuids=(gpu(2), gpu(6))), "holders"
        )
        (answer,) = await node.confirmations(remediation_commands.GpuHoldersListed)

    assert answer.pods == (NamespacedName(namespace="ml", name="inference"),)


async def test_a_kubelet_that_is_down_makes_the_holders_unknown(host: HostRoot) -> None:
    async with running_node(host, start_kubelet=False) as node:
        await node.command(remediation_commands.ListGpuHolders(gpu_uuids=(gpu(0),)), "holders")
        (answer,) = await node.confirmations(remediation_commands.GpuHoldersUnknown)

    assert "PodResources" in answer.message


def claim_on(index: int, name: str, uid: str, *pods: str) -> dra.ClaimAllocated:
    """A claim of another DRA driver's device that is GPU `index`, reserved by `pods`."""
    return dra.ClaimAllocated(
        claim=dra.ClaimRef(namespace="ml", name=name, uid=uid),
        devices=(
            dra.AllocatedDevice(
                request="gpu",
                driver="gpu.example.com",
                pool=NODE,
                device=f"dev-{index}",
                gpu_uuid=gpu(index),
            ),
        ),
        pods=tuple(
            dra.PodRef(namespace="ml", name=pod, uid=f"{n:08d}-aaaa") for n, pod in enumerate(pods)
        ),
        resource_version="7",
    )


async def test_the_pods_of_resource_claims_on_a_gpu_are_its_holders_beside_the_kubelets(
    host: HostRoot,
) -> None:
    async with running_node(host) as node:
        await node.kubelet.wait_for_devices(GPU, healthy(8))
        await node.kubelet.allocate(GPU, [gpu(3)], pod="plugin-pod", namespace="ml")
        await node.publish(claim_on(3, "claim-three", "0000-0003", "claim-pod"))
        await node.publish(claim_on(5, "claim-five", "0000-0005", "bystander"))
        await node.publish(claim_on(6, "claim-six", "0000-0006", "gone"))
        await node.publish(
            dra.ClaimReleased(
                claim=dra.ClaimRef(namespace="ml", name="claim-six", uid="0000-0006"),
                deleted=True,
            )
        )

        await node.command(
            remediation_commands.ListGpuHolders(gpu_uuids=(gpu(3), gpu(6))), "holders"
        )
        (answer,) = await node.confirmations(remediation_commands.GpuHoldersListed)

    assert answer.pods == (
        NamespacedName(namespace="ml", name="claim-pod"),
        NamespacedName(namespace="ml", name="plugin-pod"),
    )
