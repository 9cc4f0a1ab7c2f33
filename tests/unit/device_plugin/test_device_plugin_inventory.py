"""The GPUs as the plugin reads them: from the recorded H200, and from simulated HGX nodes."""

from __future__ import annotations

from pathlib import Path

from gpuop.host.roots import HostRoot
from gpuop.nvml import PcieLevel, RecordedNvml, opened
from gpuop.services.device_plugin.inventory import NVLINK_SCORE, PCIE_SCORES, read_inventory
from tests.support.device_plugin import sim_inventory

RECORDED_UUID = "GPU-20bce083-dbf9-2d4f-3c35-c858915accc5"
RECORDED_GPU = "sys/bus/pci/devices/0000:00:06.0"


def test_the_recorded_h200_is_one_gpu_whose_vm_knows_no_numa_node(recorded: HostRoot) -> None:
    with opened(RecordedNvml(recorded.path.parent / "nvml.json")) as nvml:
        inventory = read_inventory(nvml, recorded)
    (gpu,) = inventory.gpus
    assert gpu.whole.uuid == RECORDED_UUID
    assert gpu.whole.numa_node is None  # NVML: NotSupported; sysfs: -1
    assert gpu.whole.device_nodes == ("/dev/nvidia0",)
    assert not gpu.mig_enabled and gpu.mig_devices == ()
    assert inventory.pair_scores == {}


def test_sysfs_gives_the_numa_node_nvml_does_not_know(recorded: HostRoot, seeded: HostRoot) -> None:
    seeded.join(f"{RECORDED_GPU}/numa_node").write_text("1\n")
    with opened(RecordedNvml(recorded.path.parent / "nvml.json")) as nvml:
        inventory = read_inventory(nvml, seeded)
    assert inventory.gpus[0].whole.numa_node == 1


def test_pairs_are_scored_by_nvlink_then_pcie_proximity(tmp_path: Path) -> None:
    inventory = sim_inventory(HostRoot(tmp_path), gpus=8)
    assert inventory.pair_scores[(0, 1)] == NVLINK_SCORE + PCIE_SCORES[PcieLevel.MULTIPLE]
    assert inventory.pair_scores[(0, 2)] == NVLINK_SCORE + PCIE_SCORES[PcieLevel.NODE]
    assert inventory.pair_scores[(0, 4)] == NVLINK_SCORE + PCIE_SCORES[PcieLevel.SYSTEM]
    assert len(inventory.pair_scores) == 28
