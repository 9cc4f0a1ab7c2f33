"""`ListGpuHolders`: the kubelet's allocations mapped back to physical GPUs, whatever form the
device ids take (UUIDs, time-slicing and MPS replicas, MIG devices, CDI names, indexes)."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from gpuop.events import remediation_commands
from gpuop.events.fields import NamespacedName
from gpuop.host.roots import HostRoot
from gpuop.kubelet.allocations import (
    Allocation,
    KubeletPodResources,
    PodResourcesUnavailable,
    socket_under,
)
from gpuop.services.device_plugin import holders
from gpuop.services.device_plugin.inventory import GpuInventory
from tests.support.device_plugin import sim_inventory

GPU = "nvidia.com/gpu"


@pytest.fixture
def inventory(tmp_path: Path) -> GpuInventory:
    """Eight GPUs, GPU 2 carved into a 3g.71gb and a 4g.71gb MIG device."""
    return sim_inventory(HostRoot(tmp_path), mig={2: ["3g.71gb", "4g.71gb"]})


def uuid(inventory: GpuInventory, index: int) -> str:
    return inventory.gpus[index].whole.gpu_uuid


def mig(inventory: GpuInventory, index: int, n: int) -> str:
    return inventory.gpus[index].mig_devices[n].uuid


def given(pod: str, device_id: str, resource: str = GPU, container: str = "main") -> Allocation:
    namespace, name = pod.split("/")
    return Allocation(resource, device_id, namespace, name, container)


def pods(*names: str) -> tuple[NamespacedName, ...]:
    return tuple(NamespacedName(namespace=n.split("/")[0], name=n.split("/")[1]) for n in names)


class Kubelet:
    """PodResources answering from a list, or not at all."""

    def __init__(self, *allocations: Allocation, unavailable: str | None = None) -> None:
        self.given = allocations
        self.unavailable = unavailable
        self.closed = False

    async def allocations(self) -> tuple[Allocation, ...]:
        if self.unavailable is not None:
            raise PodResourcesUnavailable(self.unavailable)
        return self.given

    async def close(self) -> None:
        self.closed = True


def test_every_form_of_device_id_maps_to_its_physical_gpu(inventory: GpuInventory) -> None:
    gpu0, gpu2, gpu3 = uuid(inventory, 0), uuid(inventory, 2), uuid(inventory, 3)
    forms = {
        gpu0: gpu0,
        f"{gpu0}::3": gpu0,
        mig(inventory, 2, 1): gpu2,
        f"{mig(inventory, 2, 0)}::1": gpu2,
        f"nvidia.com/gpu={gpu3}": gpu3,
        f"k8s.device-plugin.nvidia.com/gpu={mig(inventory, 2, 0)}": gpu2,
        "3": gpu3,
        "2:1": gpu2,
        "nvidia.com/gpu=0": gpu0,
    }

    mapped = {form: holders.physical_gpus(form, inventory) for form in forms}

    assert mapped == {form: frozenset({gpu}) for form, gpu in forms.items()}
    assert holders.physical_gpus("nvidia.com/gpu=all", inventory) == frozenset(
        gpu.whole.gpu_uuid for gpu in inventory.gpus
    )


@pytest.mark.parametrize("device_id", ["MIG-00000000-0000-0000-0000-000000000000", "42", "gpu"])
def test_an_id_of_no_gpu_of_the_node_maps_to_none(inventory: GpuInventory, device_id: str) -> None:
    assert holders.physical_gpus(device_id, inventory) is None


def test_time_sliced_replicas_name_every_pod_sharing_the_gpu_and_no_other(
    inventory: GpuInventory,
) -> None:
    gpu0, gpu1 = uuid(inventory, 0), uuid(inventory, 1)
    kubelet = [
        given("ml/a", f"{gpu0}::1"),
        given("ml/b", f"{gpu0}::3", resource="nvidia.com/gpu.shared"),
        given("ml/b", f"{gpu0}::2", resource="nvidia.com/gpu.shared", container="sidecar"),
        given("ml/c", f"{gpu1}::0"),
        given("infra/rdma", "rdma0", resource="rdma/rdma_shared_device_a"),
    ]

    assert holders.pods_holding(kubelet, inventory, [gpu0]) == pods("ml/a", "ml/b")
    assert holders.pods_holding(kubelet, inventory, [gpu1]) == pods("ml/c")
    assert holders.pods_holding(kubelet, inventory, [uuid(inventory, 7)]) == ()


def test_mig_devices_name_the_pods_on_their_gpu(inventory: GpuInventory) -> None:
    kubelet = [
        given("ml/small", mig(inventory, 2, 0), resource="nvidia.com/mig-3g.71gb"),
        given("ml/big", mig(inventory, 2, 1), resource="nvidia.com/mig-4g.71gb"),
        given("ml/whole", uuid(inventory, 3)),
    ]

    assert holders.pods_holding(kubelet, inventory, [uuid(inventory, 2)]) == pods(
        "ml/big", "ml/small"
    )
    assert holders.pods_holding(kubelet, inventory, [uuid(inventory, 3)]) == pods("ml/whole")


def test_a_gpu_id_that_names_no_gpu_counts_its_pod_as_a_holder(inventory: GpuInventory) -> None:
    kubelet = [
        given("ml/stale", "MIG-00000000-0000-0000-0000-000000000000", "nvidia.com/mig-1g.18gb"),
        given("infra/odd", "whatever", resource="example.com/fpga"),
    ]

    assert holders.pods_holding(kubelet, inventory, [uuid(inventory, 5)]) == pods("ml/stale")


async def test_the_answer_lists_the_holders_of_the_gpus_asked(inventory: GpuInventory) -> None:
    gpu0, gpu4 = uuid(inventory, 0), uuid(inventory, 4)
    kubelet = Kubelet(given("ml/a", gpu0), given("ml/b", gpu4), given("ml/c", uuid(inventory, 5)))
    command = remediation_commands.ListGpuHolders(gpu_uuids=(gpu0, gpu4))

    answer = await holders.answer("cmd-1", command, kubelet, inventory)

    assert answer == remediation_commands.GpuHoldersListed(
        command_id="cmd-1", gpu_uuids=(gpu0, gpu4), pods=pods("ml/a", "ml/b")
    )


async def test_free_gpus_are_listed_with_no_pods(inventory: GpuInventory) -> None:
    command = remediation_commands.ListGpuHolders(gpu_uuids=(uuid(inventory, 6),))

    answer = await holders.answer("cmd-1", command, Kubelet(), inventory)

    assert isinstance(answer, remediation_commands.GpuHoldersListed)
    assert answer.pods == ()


async def test_a_kubelet_that_does_not_answer_makes_the_holders_unknown(
    inventory: GpuInventory,
) -> None:
    kubelet = Kubelet(unavailable="PodResources List: UNAVAILABLE: connection refused")
    command = remediation_commands.ListGpuHolders(gpu_uuids=(uuid(inventory, 0),))

    answer = await holders.answer("cmd-1", command, kubelet, inventory)

    assert answer == remediation_commands.GpuHoldersUnknown(
        command_id="cmd-1", message="PodResources List: UNAVAILABLE: connection refused"
    )


async def test_a_missing_pod_resources_socket_says_what_to_mount(tmp_path: Path) -> None:
    kubelet = KubeletPodResources(socket_under(tmp_path))

    with pytest.raises(PodResourcesUnavailable, match="is the pod-resources directory mounted"):
        await kubelet.allocations()
    await kubelet.close()


@pytest.mark.parametrize("fields", [{"gpu_uuids": ()}, {"gpu_uuids": ("GPU-0",)}, {}])
def test_a_malformed_holder_listing_is_refused(fields: dict[str, object]) -> None:
    with pytest.raises(pydantic.ValidationError):
        remediation_commands.ListGpuHolders.model_validate(fields)
