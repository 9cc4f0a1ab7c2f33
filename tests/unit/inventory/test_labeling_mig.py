"""GFD's MIG labels: per profile under `mixed`, the `gpu.*` labels of the one profile under
`single` (or `-MIG-INVALID`), from the MIG devices a scan of the simulated node finds after
its driver-manager carved them (the node's shared MIG state)."""

from __future__ import annotations

from pathlib import Path

from gpuop.events.hardware import HardwareDiscovered
from gpuop.inventory import labeling
from gpuop.inventory.labeling import LabelSettings, MigStrategy
from gpuop.nvml import open_backend, opened
from gpuop.nvml.mig_layout import GpuLayout, MigBackend
from gpuop_sim.cluster import hosts
from tests.support.inventories import carved

BOOT_ID = "6f0e6b1c-3a52-4b8e-9a1d-0c5c2f3e4d5a"
MIXED = LabelSettings(mig_strategy=MigStrategy.MIXED)
SINGLE = LabelSettings(mig_strategy=MigStrategy.SINGLE)


def mig_labels(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k.startswith("nvidia.com/mig-")}


def test_mixed_labels_each_profile_as_gfd_does(tmp_path: Path) -> None:
    inventory = carved(
        tmp_path,
        {
            0: GpuLayout.of(True, ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"]),
            1: GpuLayout.of(True, ["1g.18gb+me"]),
        },
    )
    assert [len(gpu.mig_devices) for gpu in inventory.gpus] == [4, 1]
    labels = mig_labels(labeling.labels_for(inventory, MIXED))
    one_g = {k: v for k, v in labels.items() if k.startswith("nvidia.com/mig-1g.18gb.")}
    assert {k: v for k, v in one_g.items() if ".me." not in k} == {
        "nvidia.com/mig-1g.18gb.count": "2",
        "nvidia.com/mig-1g.18gb.memory": str(inventory.gpus[0].mig_devices[-1].memory_bytes >> 20),
        "nvidia.com/mig-1g.18gb.multiprocessors": "16",
        "nvidia.com/mig-1g.18gb.slices.gi": "1",
        "nvidia.com/mig-1g.18gb.slices.ci": "1",
        "nvidia.com/mig-1g.18gb.engines.copy": "1",
        "nvidia.com/mig-1g.18gb.engines.decoder": "1",
        "nvidia.com/mig-1g.18gb.engines.encoder": "0",
        "nvidia.com/mig-1g.18gb.engines.jpeg": "1",
        "nvidia.com/mig-1g.18gb.engines.ofa": "0",
        "nvidia.com/mig-1g.18gb.product": "NVIDIA-H200-MIG-1g.18gb",
        "nvidia.com/mig-1g.18gb.replicas": "1",
        "nvidia.com/mig-1g.18gb.sharing-strategy": "none",
    }
    assert labels["nvidia.com/mig-3g.71gb.slices.gi"] == "3"
    assert labels["nvidia.com/mig-1g.18gb.me.count"] == "1"
    assert labels["nvidia.com/mig-1g.18gb.me.engines.ofa"] == "1"
    assert {k.removesuffix(".count") for k in labels if k.endswith(".count")} == {
        "nvidia.com/mig-1g.18gb",
        "nvidia.com/mig-1g.18gb.me",
        "nvidia.com/mig-2g.35gb",
        "nvidia.com/mig-3g.71gb",
    }
    assert labeling.labels_for(inventory, MIXED)["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert mig_labels(labeling.labels_for(inventory)) == {}  # strategy none


def test_single_describes_the_one_profile_in_the_gpu_labels(tmp_path: Path) -> None:
    seven = GpuLayout.of(True, ["1g.18gb"] * 7)
    labels = labeling.labels_for(carved(tmp_path, {0: seven, 1: seven}), SINGLE)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200-MIG-1g.18gb"
    assert labels["nvidia.com/gpu.count"] == "14"
    assert labels["nvidia.com/gpu.multiprocessors"] == "16"
    assert (labels["nvidia.com/gpu.slices.gi"], labels["nvidia.com/gpu.slices.ci"]) == ("1", "1")
    assert int(labels["nvidia.com/gpu.memory"]) < 143771 // 7
    assert mig_labels(labels) == {}


def test_single_with_mig_on_one_gpu_only_is_invalid(tmp_path: Path) -> None:
    labels = labeling.labels_for(carved(tmp_path, {0: GpuLayout.of(True, ["7g.141gb"])}), SINGLE)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200-MIG-INVALID"
    assert labels["nvidia.com/gpu.count"] == "0"


def test_single_with_two_profiles_or_an_empty_gpu_is_invalid(tmp_path: Path) -> None:
    layouts = {0: GpuLayout.of(True, ["3g.71gb", "4g.71gb"]), 1: GpuLayout(True)}
    labels = labeling.labels_for(carved(tmp_path, layouts), SINGLE)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200-MIG-INVALID"


def test_single_with_mig_off_everywhere_labels_whole_gpus(tmp_path: Path) -> None:
    labels = labeling.labels_for(carved(tmp_path, {}), SINGLE)
    assert (labels["nvidia.com/gpu.product"], labels["nvidia.com/gpu.count"]) == (
        "NVIDIA-H200",
        "2",
    )


def test_an_inventory_without_mig_devices_hashes_as_before_they_existed(tmp_path: Path) -> None:
    inventory = carved(tmp_path, {})
    dumped = inventory.model_dump(mode="json")
    assert all(gpu["mig_devices"] == [] for gpu in dumped["gpus"])
    for gpu in dumped["gpus"]:
        del gpu["mig_devices"]
    old = HardwareDiscovered.model_validate(dumped)
    assert old.content_hash() == inventory.content_hash()
    with_mig = carved(tmp_path / "again", {0: GpuLayout.of(True, ["7g.141gb"])})
    assert (
        with_mig.content_hash()
        != with_mig.model_copy(
            update={"gpus": tuple(g.model_copy(update={"mig_devices": ()}) for g in with_mig.gpus)}
        ).content_hash()
    )


def test_the_sim_backend_is_a_mig_backend(tmp_path: Path) -> None:
    root = hosts.build_host_root(tmp_path / "host", "node-1", 1, boot_id=BOOT_ID)
    backend: MigBackend = open_backend("sim:1", host_root=root.path, node="node-1")  # type: ignore[assignment]
    with opened(backend):  # type: ignore[type-var]
        assert backend.mig_mode(0).current is False
