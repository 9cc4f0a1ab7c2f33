"""A node's GPUs as DRA devices with NVIDIA's names, attributes and capacities: the recorded
H200 as scanned, MIG devices as carved on a simulated node, and pools split into slices."""

from __future__ import annotations

from pathlib import Path

from gpuop.events.hardware import MigInstance, MigMode
from gpuop.inventory import dra_devices, scanning
from gpuop.nvml import open_backend
from gpuop.nvml.mig_layout import GpuLayout
from gpuop_sim import recordings
from gpuop_sim.host import seeding
from tests.support.inventories import H200, carved, inventory

BOOT_ID = "6f0e6b1c-3a52-4b8e-9a1d-0c5c2f3e4d5a"


def test_the_recorded_h200_is_one_gpu_device_named_and_described_as_nvidias(
    tmp_path: Path,
) -> None:
    root = seeding.seed_host_root(tmp_path / "host", recordings.H200_HOST_ROOT, boot_id=BOOT_ID)
    nvml = open_backend(
        f"recorded:{recordings.H200_HOST_ROOT.parent / 'nvml.json'}",
        host_root=root.path,
        node="h200",
    )

    [device] = dra_devices.devices_of(scanning.scan(root, nvml))

    assert device.name == "gpu-0"
    assert device.body["attributes"] == {
        "type": {"string": "gpu"},
        "uuid": {"string": "GPU-20bce083-dbf9-2d4f-3c35-c858915accc5"},
        "productName": {"string": "NVIDIA H200"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.159.4"},
        "cudaDriverVersion": {"version": "13.0.0"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:00:06.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
    }
    assert device.body["capacity"] == {"memory": {"value": "143771Mi"}}
    assert (device.gpu_uuid, device.mig_uuid) == ("GPU-20bce083-dbf9-2d4f-3c35-c858915accc5", None)


def test_versions_are_normalised_as_semver_and_unknown_ones_left_out() -> None:
    assert dra_devices.semver("580.159.04") == "580.159.4"
    assert dra_devices.semver("13.0") == "13.0.0"
    assert dra_devices.semver("535") == "535.0.0"
    assert dra_devices.semver("580.159.04.1") is None
    assert dra_devices.semver(None) is None

    [device] = dra_devices.devices_of(inventory(driver_version=None, cuda_driver_version=None))
    assert "driverVersion" not in device.body["attributes"]
    assert "cudaDriverVersion" not in device.body["attributes"]
    assert "brand" not in device.body["attributes"]  # the fixture's GPU names none
    assert dra_devices.PCIE_ROOT not in device.body["attributes"]  # nor its root complex


def test_quantities_take_the_largest_exact_binary_suffix() -> None:
    assert dra_devices.binary_quantity(150754820096) == "143771Mi"
    assert dra_devices.binary_quantity(80 * 1024**3) == "80Gi"
    assert dra_devices.binary_quantity(1500) == "1500"
    assert dra_devices.binary_quantity(0) == "0"
    assert dra_devices.architecture_name("ada-lovelace") == "Ada Lovelace"


def test_a_gpu_in_mig_mode_publishes_its_mig_devices_as_carved(tmp_path: Path) -> None:
    scanned = carved(tmp_path, {0: GpuLayout.of(True, ["1g.18gb", "3g.71gb"])})
    mig_gpu, whole = sorted(scanned.gpus, key=lambda gpu: gpu.minor_number)
    assert mig_gpu.mig_mode is MigMode.ENABLED

    devices = dra_devices.devices_of(scanned)

    by_profile = {mig.profile: mig for mig in mig_gpu.mig_devices}
    one, three = by_profile["1g.18gb"], by_profile["3g.71gb"]
    assert sorted(device.name for device in devices) == sorted(
        [
            f"gpu-0-mig-1g18gb-{one.gpu_instance_profile_id}-{one.placement_start}",
            f"gpu-0-mig-3g71gb-{three.gpu_instance_profile_id}-{three.placement_start}",
            f"gpu-{whole.minor_number}",
        ]
    )
    assert devices[-1].name == f"gpu-{whole.minor_number}"
    one_g = next(d for d in devices if d.mig_uuid == one.uuid)
    attributes, capacity = one_g.body["attributes"], one_g.body["capacity"]
    assert attributes["type"] == {"string": "mig"}
    assert attributes["parentUUID"] == {"string": mig_gpu.uuid}
    assert attributes["profile"] == {"string": "1g.18gb"}
    assert attributes["productName"] == {"string": mig_gpu.model_name}
    assert one_g.gpu_uuid == mig_gpu.uuid
    assert capacity["multiprocessors"] == {"value": str(one.multiprocessors)}
    assert capacity["memory"] == {"value": dra_devices.binary_quantity(one.memory_bytes)}
    assert [key for key in capacity if key.startswith("memorySlice")] == [
        f"memorySlice{one.placement_start}"
    ]
    three_g = next(d for d in devices if d.mig_uuid == three.uuid).body["capacity"]
    assert (
        len([key for key in three_g if key.startswith("memorySlice")]) == three.placement_size == 4
    )


def test_a_mig_device_without_its_placement_is_named_by_position() -> None:
    mig = MigInstance(
        uuid="MIG-00000000-0000-0000-0000-000000000001",
        profile="1g.18gb",
        gpu_instance_slices=1,
        compute_instance_slices=1,
        memory_bytes=1024,
        multiprocessors=16,
    )
    gpu = H200.model_copy(update={"mig_mode": MigMode.ENABLED, "mig_devices": (mig,)})
    scanned = inventory(gpus=(gpu,))

    [device] = dra_devices.devices_of(scanned)

    assert device.name == "gpu-0-mig-0"
    assert not [key for key in device.body["capacity"] if key.startswith("memorySlice")]


def test_a_pool_of_more_than_128_devices_is_split_with_its_slice_count() -> None:
    gpu = dra_devices.gpu_device(H200, inventory())
    devices = tuple(
        dra_devices.DraDevice(f"gpu-{i}", gpu.gpu_uuid, None, {**gpu.body, "name": f"gpu-{i}"})
        for i in range(130)
    )

    slices = dra_devices.resource_slices("node-1", "uid-1", devices, generation=3)

    assert [len(s["spec"]["devices"]) for s in slices] == [128, 2]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
    assert {s["spec"]["pool"]["generation"] for s in slices} == {3}
    assert [s["metadata"]["name"] for s in slices] == [
        "node-1-gpu.nvidia.com-0",
        "node-1-gpu.nvidia.com-1",
    ]
    owner = slices[0]["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", "node-1", "uid-1")
    assert slices[1]["spec"]["nodeName"] == slices[1]["spec"]["pool"]["name"] == "node-1"


def test_a_node_without_gpus_publishes_one_empty_slice() -> None:
    [empty] = dra_devices.resource_slices("node-1", "uid-1", (), generation=1)

    assert empty["spec"]["devices"] == []
    assert empty["spec"]["pool"]["resourceSliceCount"] == 1


def test_a_long_node_name_keeps_slice_names_within_253_characters() -> None:
    node = "n" * 250
    names = {dra_devices.slice_name(node, index) for index in range(3)}

    assert len(names) == 3
    assert all(len(name) <= dra_devices.MAX_NAME for name in names)


def test_content_differs_when_devices_change_not_when_only_the_generation_does() -> None:
    device = dra_devices.gpu_device(H200, inventory())
    [first] = dra_devices.resource_slices("node-1", "uid", (device,), generation=1)
    [bumped] = dra_devices.resource_slices("node-1", "uid", (device,), generation=2)
    [upgraded] = dra_devices.resource_slices(
        "node-1", "uid", dra_devices.devices_of(inventory(driver_version="590.10.01")), 2
    )

    assert dra_devices.same_content(first, bumped)
    assert not dra_devices.same_content(first, upgraded)
