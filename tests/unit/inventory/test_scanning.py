"""A node's inventory from its host root and NVML: the recorded H200 exactly as recorded, a
simulated 8-GPU node whose sysfs and NVML agree, and a node whose driver is unloaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.events.driver import Flavour
from gpuop.events.hardware import HardwareDiscovered, MigMode
from gpuop.host.errors import HostReadError
from gpuop.host.roots import HostRoot
from gpuop.inventory import labeling, scanning
from gpuop.nvml import open_backend
from gpuop_sim import recordings
from gpuop_sim.cluster import hosts
from gpuop_sim.host import seeding
from gpuop_sim.host.simkernel import SimKernel

RECORDED = recordings.H200_HOST_ROOT
BOOT_ID = "8c1f2f5e-0c53-4d57-a0a4-3e3c1b0c9a11"
H200_UUID = "GPU-20bce083-dbf9-2d4f-3c35-c858915accc5"


@pytest.fixture
def recorded_nvml_spec() -> str:
    return f"recorded:{RECORDED.parent / 'nvml.json'}"


@pytest.fixture
def h200_root(tmp_path: Path) -> HostRoot:
    return seeding.seed_host_root(tmp_path / "host", RECORDED, boot_id=BOOT_ID)


def unload_gpu_driver(root: HostRoot) -> None:
    kernel = SimKernel(root)
    kernel.rmmod("nvidia_uvm")
    kernel.rmmod("nvidia")


def test_the_recorded_h200_is_reported_exactly_as_recorded(
    h200_root: HostRoot, recorded_nvml_spec: str
) -> None:
    nvml = open_backend(recorded_nvml_spec, host_root=h200_root.path, node="h200")

    inventory = scanning.scan(h200_root, nvml)

    [gpu] = inventory.gpus
    assert gpu.model_name == "NVIDIA H200"
    assert gpu.uuid == H200_UUID
    assert gpu.pci_bus_id == "0000:00:06.0"
    assert gpu.compute_capability == "9.0"
    assert gpu.architecture == "hopper"
    assert gpu.memory_bytes == 150754820096
    assert gpu.mig_mode is MigMode.DISABLED
    [function] = [f for f in inventory.pci_functions if f.vendor_id == "10de"]
    assert (function.address, function.device_id, function.class_id) == (
        "0000:00:06.0",
        "2335",
        "030200",
    )
    assert (function.subsystem_vendor_id, function.subsystem_device_id) == ("10de", "18bf")
    assert (function.link_speed_gts, function.link_width, function.driver) == (32.0, 16, "nvidia")
    assert len(inventory.pci_functions) == 7
    assert inventory.driver_version == "580.159.04"
    assert inventory.cuda_driver_version == "13.0"
    assert inventory.kernel_release == "6.18.44-fc-v657-gpu"
    assert inventory.machine == "x86_64"
    assert inventory.boot_id == BOOT_ID
    assert inventory.modules_loaded == ("nvidia", "nvidia_uvm")
    assert inventory.ofed_version is None
    assert inventory.inventory_hash == inventory.content_hash()


def test_the_recorded_h200_implies_the_gfd_and_nfd_labels(
    h200_root: HostRoot, recorded_nvml_spec: str
) -> None:
    nvml = open_backend(recorded_nvml_spec, host_root=h200_root.path, node="h200")

    labels = labeling.labels_for(scanning.scan(h200_root, nvml))

    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert labels["nvidia.com/gpu.count"] == "1"
    assert labels["nvidia.com/gpu.memory"] == "143771"
    assert labels["nvidia.com/gpu.family"] == "hopper"
    assert labels["nvidia.com/gpu.mode"] == "compute"
    assert labels["nvidia.com/cuda.driver-version.full"] == "580.159.04"
    assert labels["nvidia.com/cuda.driver-version.revision"] == "04"
    assert labels["nvidia.com/cuda.runtime-version.full"] == "13.0"
    assert labels["nvidia.com/gpu.compute.major"] == "9"
    assert labels["nvidia.com/gpu.compute.minor"] == "0"
    assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"
    assert labels["feature.node.kubernetes.io/pci-0302_10de.present"] == "true"
    assert labels["feature.node.kubernetes.io/kernel-version.full"] == "6.18.44-fc-v657-gpu"


def test_the_recording_itself_scans_read_only_with_an_unknown_boot_id() -> None:

    inventory = scanning.scan(HostRoot(RECORDED), None)

    assert inventory.boot_id == scanning.UNKNOWN_BOOT_ID
    assert inventory.gpus == ()
    assert inventory.driver_version == "580.159.04"


def test_a_simulated_8_gpu_node_agrees_in_sysfs_and_nvml(tmp_path: Path) -> None:
    root = hosts.build_host_root(tmp_path / "host", "node-1", 8, boot_id=BOOT_ID)
    nvml = open_backend("sim:8", host_root=root.path, node="node-1")

    inventory = scanning.scan(root, nvml)

    nvidia_functions = [f for f in inventory.pci_functions if f.vendor_id == "10de"]
    assert len(inventory.gpus) == 8
    assert [f.address for f in nvidia_functions] == [g.pci_bus_id for g in inventory.gpus]
    assert [f.numa_node for f in nvidia_functions] == [g.numa_node for g in inventory.gpus]
    assert [g.numa_node for g in inventory.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g.pcie_root for g in inventory.gpus] == [
        f"pci0000:{int(g.pci_bus_id.split(':')[1], 16) - 1:02x}" for g in inventory.gpus
    ]
    assert inventory.gpus[0].pcie_root == "pci0000:0f"  # above 0000:10:00.0
    assert {f.driver for f in nvidia_functions} == {"nvidia"}
    assert len({g.uuid for g in inventory.gpus}) == 8
    labels = labeling.labels_for(inventory)
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.mode"] == "compute"


def test_the_driver_lists_each_simulated_gpu_under_its_address(tmp_path: Path) -> None:
    root = hosts.build_host_root(tmp_path / "host", "node-1", 4)
    nvml = open_backend("sim:4", host_root=root.path, node="node-1")

    inventory = scanning.scan(root, nvml)

    for gpu in inventory.gpus:
        text = root.read_text(f"proc/driver/nvidia/gpus/{gpu.pci_bus_id}/information")
        assert text is not None
        assert gpu.uuid in text
        assert f"Device Minor: \t {gpu.minor_number}" in text
    assert root.read_text("proc/driver/nvidia/gpus/0000:00:06.0/information") is None


def test_without_a_loaded_driver_there_are_no_gpus_and_no_driver_version(tmp_path: Path) -> None:
    root = hosts.build_host_root(tmp_path / "host", "node-1", 8)
    unload_gpu_driver(root)
    nvml = open_backend("sim:8", host_root=root.path, node="node-1")

    inventory = scanning.scan(root, nvml)

    assert inventory.gpus == ()
    assert inventory.driver_version is None
    assert inventory.cuda_driver_version is None
    assert inventory.modules_loaded == ()
    assert inventory.machine == "x86_64"
    assert {f.driver for f in inventory.pci_functions if f.vendor_id == "10de"} == {None}
    labels = labeling.labels_for(inventory)
    assert labels["nvidia.com/gpu.present"] == "true"
    assert "nvidia.com/gpu.count" not in labels


def test_reloading_the_driver_brings_every_simulated_gpu_back(tmp_path: Path) -> None:
    root = hosts.build_host_root(tmp_path / "host", "node-1", 8)
    unload_gpu_driver(root)
    SimKernel(root).modprobe("nvidia")
    nvml = open_backend("sim:8", host_root=root.path, node="node-1")

    inventory = scanning.scan(root, nvml)

    assert len(inventory.gpus) == 8
    assert {f.driver for f in inventory.pci_functions if f.vendor_id == "10de"} == {"nvidia"}


def test_the_scan_lets_go_of_nvml_so_the_driver_can_be_unloaded(tmp_path: Path) -> None:
    root = hosts.build_host_root(tmp_path / "host", "node-1", 2)
    nvml = open_backend("sim:2", host_root=root.path, node="node-1", holder_id="discovery")

    scanning.scan(root, nvml)

    assert SimKernel(root).holders("nvidia") == ()
    unload_gpu_driver(root)


def test_a_host_only_scan_keeps_the_gpus_while_the_same_driver_is_loaded(tmp_path: Path) -> None:
    root = hosts.build_host_root(tmp_path / "host", "node-1", 2)
    full = scanning.scan(root, open_backend("sim:2", host_root=root.path, node="node-1"))

    kept = scanning.with_known_gpus(scanning.scan(root, None), full)
    unload_gpu_driver(root)
    after_unload = scanning.with_known_gpus(scanning.scan(root, None), full)

    assert kept == full
    assert after_unload.gpus == ()
    assert after_unload.inventory_hash == after_unload.content_hash()


def test_the_dmi_product_name_and_os_release_are_reported(tmp_path: Path) -> None:
    root = hosts.build_host_root(tmp_path / "host", "node-1", 1, product_name="p5e.48xlarge")
    (root.path / "etc").mkdir()
    (root.path / "etc/os-release").write_text('ID=ubuntu\nVERSION_ID="24.04"\n')

    inventory = scanning.scan(root, None)

    assert inventory.product_name == "p5e.48xlarge"
    assert (inventory.os_id, inventory.os_version_id) == ("ubuntu", "24.04")


def test_only_managed_modules_are_listed_sorted(tmp_path: Path) -> None:
    root = hosts.build_host_root(tmp_path / "host", "node-1", 1, ofed_version="24.10-1.1.4.0")

    inventory = scanning.scan(root, None)

    assert inventory.modules_loaded == ("ib_core", "mlx5_core", "mlx5_ib", "nvidia", "nvidia_uvm")
    assert inventory.ofed_version == "24.10-1.1.4.0"


def test_a_host_root_without_a_kernel_is_refused_with_the_file_named(tmp_path: Path) -> None:
    with pytest.raises(HostReadError, match="proc/version"):
        scanning.scan(HostRoot(tmp_path), None)


def test_the_hash_changes_with_any_field() -> None:
    base = HardwareDiscovered(
        kernel_release="6.8.0-49-generic",
        machine="x86_64",
        boot_id=scanning.UNKNOWN_BOOT_ID,
        inventory_hash=scanning.PLACEHOLDER_HASH,
    )
    other = base.model_copy(update={"driver_version": "580.159.04"})

    assert scanning.hashed(base).inventory_hash != scanning.hashed(other).inventory_hash
    assert scanning.hashed(base).inventory_hash == base.content_hash()


def test_the_loaded_drivers_flavour_comes_from_the_kernels_own_report(
    h200_root: HostRoot,
) -> None:
    assert scanning.scan(h200_root, None).driver_flavour is Flavour.OPEN  # as recorded

    h200_root.join("proc/driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Thu Oct 19 2025\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )
    proprietary = scanning.scan(h200_root, None)

    assert (proprietary.driver_version, proprietary.driver_flavour) == (
        "535.261.03",
        Flavour.PROPRIETARY,
    )


def test_without_a_loaded_driver_there_is_no_flavour(tmp_path: Path) -> None:
    root = hosts.build_host_root(tmp_path / "host", "node-1", 2)
    unload_gpu_driver(root)

    assert scanning.scan(root, None).driver_flavour is None
