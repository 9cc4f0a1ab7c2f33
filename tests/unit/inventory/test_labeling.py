"""Labels implied by an inventory match GPU Feature Discovery and NFD keys and formats."""

from __future__ import annotations

from gpuop.events.hardware import MigMode
from gpuop.inventory.labeling import GFD, NFD, LabelSettings, MigStrategy, labels_for, merge
from tests.support.inventories import H200, NIC_FUNCTION, inventory


def test_one_h200_gets_the_gfd_labels_upstream_would_set() -> None:
    labels = labels_for(inventory())
    assert {k: v for k, v in labels.items() if k.startswith(GFD)} == {
        "nvidia.com/cuda.driver-version.major": "580",
        "nvidia.com/cuda.driver-version.minor": "159",
        "nvidia.com/cuda.driver-version.revision": "04",
        "nvidia.com/cuda.driver-version.full": "580.159.04",
        "nvidia.com/cuda.driver.major": "580",
        "nvidia.com/cuda.driver.minor": "159",
        "nvidia.com/cuda.driver.rev": "04",
        "nvidia.com/cuda.runtime-version.major": "13",
        "nvidia.com/cuda.runtime-version.minor": "0",
        "nvidia.com/cuda.runtime-version.full": "13.0",
        "nvidia.com/cuda.runtime.major": "13",
        "nvidia.com/cuda.runtime.minor": "0",
        "nvidia.com/gpu.count": "1",
        "nvidia.com/gpu.product": "NVIDIA-H200",
        "nvidia.com/gpu.memory": "143771",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.mode": "compute",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "none",
        "nvidia.com/mps.capable": "false",
        "nvidia.com/vgpu.present": "false",
    }


def test_nfd_labels_cover_pci_kernel_and_os() -> None:
    labels = labels_for(inventory())
    assert {k: v for k, v in labels.items() if k.startswith(NFD)} == {
        "feature.node.kubernetes.io/pci-0302_10de.present": "true",
        "feature.node.kubernetes.io/pci-10de.present": "true",
        "feature.node.kubernetes.io/pci-0200_15b3.present": "true",
        "feature.node.kubernetes.io/pci-15b3.present": "true",
        "feature.node.kubernetes.io/kernel-version.full": "6.18.44-fc-v657-gpu",
        "feature.node.kubernetes.io/kernel-version.major": "6",
        "feature.node.kubernetes.io/kernel-version.minor": "18",
        "feature.node.kubernetes.io/kernel-version.revision": "44",
        "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID": "24.04",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID.major": "24",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID.minor": "04",
    }


def test_eight_gpus_shared_by_time_slicing() -> None:
    gpus = tuple(H200.model_copy(update={"index": i, "minor_number": i}) for i in range(8))
    labels = labels_for(inventory(gpus), LabelSettings(replicas=4, timestamp=1764403200))
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200-SHARED"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gfd.timestamp"] == "1764403200"


def test_mig_strategy_follows_settings_and_unsupported_gpus_have_none() -> None:
    assert (
        labels_for(inventory(), LabelSettings(mig_strategy=MigStrategy.MIXED))[
            "nvidia.com/mig.strategy"
        ]
        == "mixed"
    )
    old = H200.model_copy(update={"mig_mode": MigMode.UNSUPPORTED})
    labels = labels_for(inventory((old,)))
    assert labels["nvidia.com/mig.capable"] == "false"
    assert "nvidia.com/mig.strategy" not in labels


def test_unknown_os_and_no_gpu_vendor_give_no_such_labels() -> None:
    labels = labels_for(
        inventory((), os_id=None, os_version_id=None, pci_functions=(NIC_FUNCTION,))
    )
    assert not any("os_release" in key for key in labels)
    assert not any(key.startswith(GFD) for key in labels)


def test_driver_unloaded_keeps_nvml_labels_but_a_removed_gpu_loses_them() -> None:
    current = labels_for(inventory(product_name="p5e.48xlarge"))
    unloaded = inventory((), driver_version=None, cuda_driver_version=None)
    kept = merge(current, labels_for(unloaded), unloaded)
    assert kept == current, "no label of the loaded driver goes away while it is reloaded"
    assert kept["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert kept["nvidia.com/cuda.driver-version.full"] == "580.159.04"
    gone = inventory((), driver_version=None, pci_functions=(NIC_FUNCTION,))
    assert "nvidia.com/gpu.product" not in merge(current, labels_for(gone), gone)


CLIQUE = "6f1c2a9e-0b7d-4c35-9a8e-2f4b1d0c7e55.32766"


def test_the_clique_label_names_the_nvlink_domain_every_gpu_is_in() -> None:
    in_clique = tuple(
        H200.model_copy(update={"index": i, "minor_number": i, "clique": CLIQUE}) for i in range(4)
    )
    assert labels_for(inventory(in_clique))["nvidia.com/gpu.clique"] == CLIQUE
    assert "nvidia.com/gpu.clique" not in labels_for(inventory())  # an H200 has none
    split = (*in_clique[:2], *(g.model_copy(update={"clique": None}) for g in in_clique[2:]))
    assert "nvidia.com/gpu.clique" not in labels_for(inventory(split))  # not one domain
    other = in_clique[3].model_copy(update={"clique": CLIQUE.replace("32766", "1")})
    assert "nvidia.com/gpu.clique" not in labels_for(inventory((*in_clique[:3], other)))
