"""Which resources and device ids the plugin advertises, and what Allocate answers for them:
whole GPUs, time-sliced replicas and MIG devices, under both device list strategies."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.host.roots import HostRoot
from gpuop.services.device_plugin import cdi
from gpuop.services.device_plugin.errors import AllocationError
from gpuop.services.device_plugin.resources import GpuResource, gpu_resources
from tests.support.device_plugin import config, sim_inventory, strategies


def sliced(**options: bool) -> dict[str, object]:
    """Four replicas per GPU, with these `sharing.timeSlicing` options."""
    resources = [{"name": "nvidia.com/gpu", "replicas": 4}]
    return {"sharing": {"timeSlicing": {"resources": resources, **options}}}


@pytest.fixture
def root(tmp_path: Path) -> HostRoot:
    return HostRoot(tmp_path)


def only(resources: tuple[GpuResource, ...], name: str) -> GpuResource:
    found = [resource for resource in resources if resource.name == name]
    assert len(found) == 1, [resource.name for resource in resources]
    return found[0]


def test_every_gpu_is_one_nvidia_gpu_device_with_its_numa_node(root: HostRoot) -> None:
    inventory = sim_inventory(root)
    plan = gpu_resources(inventory, config())
    (gpu,) = plan.resources
    assert gpu.name == "nvidia.com/gpu"
    assert [d.id for d in gpu.devices] == [g.whole.uuid for g in inventory.gpus]
    assert [d.numa_node for d in gpu.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(d.id.startswith("GPU-") for d in gpu.devices)


def test_time_slicing_gives_each_gpu_replica_ids(root: HostRoot) -> None:
    plan = gpu_resources(sim_inventory(root, gpus=2), config(sliced()))
    (gpu,) = plan.resources
    first = plan.resources[0].devices[0].target.uuid
    assert gpu.name == "nvidia.com/gpu"
    assert len(gpu.devices) == 8
    assert [d.id for d in gpu.devices[:4]] == [f"{first}::{n}" for n in range(4)]
    assert all(len(d.id) <= 63 for d in gpu.devices)


def test_rename_by_default_advertises_the_shared_resource(root: HostRoot) -> None:
    (gpu,) = gpu_resources(
        sim_inventory(root, gpus=1), config(sliced(renameByDefault=True))
    ).resources
    assert gpu.name == "nvidia.com/gpu.shared"


def test_mig_strategy_none_ignores_mig(root: HostRoot) -> None:
    inventory = sim_inventory(root, gpus=2, mig={0: ["3g.71gb", "3g.71gb"]})
    (gpu,) = gpu_resources(inventory, config()).resources
    assert [d.id for d in gpu.devices] == [g.whole.uuid for g in inventory.gpus]


def test_mig_strategy_single_advertises_mig_devices_as_gpus(root: HostRoot) -> None:
    inventory = sim_inventory(root, gpus=2, mig={0: ["3g.71gb"] * 2, 1: ["3g.71gb"] * 2})
    plan = gpu_resources(inventory, config({"flags": {"migStrategy": "single"}}))
    (gpu,) = plan.resources
    assert plan.problem is None
    assert gpu.name == "nvidia.com/gpu"
    assert len(gpu.devices) == 4
    assert all(d.id.startswith("MIG-") for d in gpu.devices)


@pytest.mark.parametrize(
    ("mig", "problem"),
    [
        ({0: ["3g.71gb"]}, "GPUs without MIG mode"),
        ({0: ["3g.71gb"], 1: ["2g.35gb"]}, "more than one MIG profile"),
    ],
)
def test_mig_strategy_single_refuses_a_mixed_layout(
    root: HostRoot, mig: dict[int, list[str]], problem: str
) -> None:
    plan = gpu_resources(
        sim_inventory(root, gpus=2, mig=mig), config({"flags": {"migStrategy": "single"}})
    )
    (gpu,) = plan.resources
    assert gpu.devices == ()
    assert plan.problem is not None and problem in plan.problem


def test_mig_strategy_mixed_advertises_one_resource_per_profile(root: HostRoot) -> None:
    inventory = sim_inventory(root, gpus=3, mig={0: ["3g.71gb", "2g.35gb", "1g.18gb+me"]})
    plan = gpu_resources(inventory, config({"flags": {"migStrategy": "mixed"}}))
    names = {r.name: len(r.devices) for r in plan.resources}
    assert names == {
        "nvidia.com/gpu": 2,
        "nvidia.com/mig-1g.18gb.me": 1,
        "nvidia.com/mig-2g.35gb": 1,
        "nvidia.com/mig-3g.71gb": 1,
    }
    mig = only(plan.resources, "nvidia.com/mig-3g.71gb")
    assert mig.devices[0].gpu_uuid == inventory.gpus[0].whole.uuid


@pytest.mark.parametrize("listing", ["envvar", "cdi"])
def test_allocate_answers_for_whole_gpus(root: HostRoot, listing: str) -> None:
    inventory = sim_inventory(root, gpus=4)
    (gpu,) = gpu_resources(inventory, strategies(listing)).resources
    first, second = inventory.gpus[0].whole.uuid, inventory.gpus[2].whole.uuid
    response = gpu.allocate([first, second])
    if listing == "envvar":
        assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{first},{second}"}
        assert list(response.cdi_devices) == []
    else:
        assert dict(response.envs) == {}
        assert [d.name for d in response.cdi_devices] == [
            f"{cdi.KIND}={first}",
            f"{cdi.KIND}={second}",
        ]


@pytest.mark.parametrize("listing", ["envvar", "cdi"])
def test_allocate_answers_for_replicas_with_each_gpu_once(root: HostRoot, listing: str) -> None:
    document = {**sliced(), "flags": {"plugin": {"deviceListStrategy": listing}}}
    (gpu,) = gpu_resources(sim_inventory(root, gpus=2), config(document)).resources
    first, second = gpu.devices[0].target.uuid, gpu.devices[4].target.uuid
    response = gpu.allocate([f"{first}::0", f"{first}::3", f"{second}::1"])
    if listing == "envvar":
        assert response.envs["NVIDIA_VISIBLE_DEVICES"] == f"{first},{second}"
    else:
        assert [d.name for d in response.cdi_devices] == [
            f"{cdi.KIND}={first}",
            f"{cdi.KIND}={second}",
        ]


@pytest.mark.parametrize("listing", ["envvar", "cdi"])
def test_allocate_answers_for_mig_devices(root: HostRoot, listing: str) -> None:
    document = {"flags": {"migStrategy": "mixed", "plugin": {"deviceListStrategy": listing}}}
    inventory = sim_inventory(root, gpus=1, mig={0: ["3g.71gb", "3g.71gb"]})
    mig = only(gpu_resources(inventory, config(document)).resources, "nvidia.com/mig-3g.71gb")
    uuids = [d.id for d in mig.devices]
    response = mig.allocate(uuids)
    if listing == "envvar":
        assert response.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)
    else:
        assert [d.name for d in response.cdi_devices] == [f"{cdi.KIND}={u}" for u in uuids]


def test_both_strategies_together_answer_both_ways(root: HostRoot) -> None:
    (gpu,) = gpu_resources(sim_inventory(root, gpus=1), strategies("envvar", "cdi")).resources
    response = gpu.allocate([gpu.devices[0].id])
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == gpu.devices[0].id
    assert len(response.cdi_devices) == 1


def test_pass_device_specs_hands_out_the_device_nodes_present(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    for node in ("nvidiactl", "nvidia-uvm"):
        (tmp_path / "dev" / node).touch()
    root = HostRoot(tmp_path)
    document = {"flags": {"plugin": {"passDeviceSpecs": True}}}
    (gpu,) = gpu_resources(sim_inventory(root, gpus=4), config(document)).resources
    response = gpu.allocate([gpu.devices[3].id])
    assert [(d.host_path, d.container_path, d.permissions) for d in response.devices] == [
        ("/dev/nvidia3", "/dev/nvidia3", "rw"),
        ("/dev/nvidiactl", "/dev/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", "/dev/nvidia-uvm", "rw"),
    ]


def test_an_unknown_device_id_is_refused_by_name(root: HostRoot) -> None:
    (gpu,) = gpu_resources(sim_inventory(root, gpus=1), config()).resources
    with pytest.raises(AllocationError, match="unknown device id 'GPU-not-here'") as refused:
        gpu.allocate([gpu.devices[0].id, "GPU-not-here"])
    assert "nvidia.com/gpu" in str(refused.value)


def test_fail_requests_greater_than_one_refuses_two_replicas(root: HostRoot) -> None:
    (gpu,) = gpu_resources(
        sim_inventory(root, gpus=1), config(sliced(failRequestsGreaterThanOne=True))
    ).resources
    assert gpu.allocate([gpu.devices[0].id]).envs["NVIDIA_VISIBLE_DEVICES"]
    with pytest.raises(AllocationError, match="maximum request size for shared resources is 1"):
        gpu.allocate([gpu.devices[0].id, gpu.devices[1].id])
