"""GetPreferredAllocation: one NUMA node first, then the best-linked set; the same answer
every time; replicas spread over GPUs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gpuop.host.roots import HostRoot
from gpuop.nvml import PcieLevel
from gpuop.services.device_plugin.errors import AllocationError
from gpuop.services.device_plugin.inventory import (
    NVLINK_SCORE,
    PCIE_SCORES,
    GpuInventory,
    Target,
)
from gpuop.services.device_plugin.resources import GpuResource, gpu_resources
from tests.support.device_plugin import config, sim_inventory


@pytest.fixture
def inventory(tmp_path: Path) -> GpuInventory:
    return sim_inventory(HostRoot(tmp_path))


@pytest.fixture
def gpus(inventory: GpuInventory) -> GpuResource:
    (resource,) = gpu_resources(inventory, config()).resources
    return resource


def numa_of(resource: GpuResource, ids: list[str]) -> set[int | None]:
    by_id = {device.id: device for device in resource.devices}
    return {by_id[i].numa_node for i in ids}


def test_it_picks_a_set_on_one_numa_node(gpus: GpuResource) -> None:
    ids = [d.id for d in gpus.devices]
    # GPUs 0-3 sit on NUMA node 0, 4-7 on node 1; offer 0, 1 and 4-7
    available = [ids[0], ids[1], *ids[4:]]
    chosen = gpus.preferred(available, [], 3)
    assert len(chosen) == 3
    assert numa_of(gpus, chosen) == {1}


def test_a_required_device_pulls_the_set_to_its_numa_node(gpus: GpuResource) -> None:
    ids = [d.id for d in gpus.devices]
    chosen = gpus.preferred(ids, [ids[6]], 4)
    assert ids[6] in chosen
    assert numa_of(gpus, chosen) == {1}


def test_within_a_numa_node_the_pcie_pair_behind_one_switch_wins(gpus: GpuResource) -> None:
    ids = [d.id for d in gpus.devices]
    # 0 and 1 share a PCIe switch; 2 is on the same NUMA node across a host bridge
    assert sorted(gpus.preferred(ids[:4], [ids[1]], 2)) == sorted([ids[0], ids[1]])


def test_the_answer_is_the_same_every_time(gpus: GpuResource) -> None:
    ids = [d.id for d in gpus.devices]
    answers = {tuple(gpus.preferred(list(reversed(ids)), [], 2)) for _ in range(5)}
    answers.add(tuple(gpus.preferred(ids, [], 2)))
    assert len({frozenset(answer) for answer in answers}) == 1


def test_nvlink_outweighs_pcie_proximity() -> None:
    def target(index: int) -> Target:
        return Target(f"GPU-{index}", f"GPU-{index}", index, 0, (f"/dev/nvidia{index}",))

    # 0-1 close over PCIe without NVLink; 0-2 and 1-2 far over PCIe but NVLinked
    scores = {
        (0, 1): PCIE_SCORES[PcieLevel.SINGLE],
        (0, 2): PCIE_SCORES[PcieLevel.SYSTEM] + NVLINK_SCORE,
        (1, 2): PCIE_SCORES[PcieLevel.SYSTEM],
    }
    inventory = GpuInventory(gpus=(), pair_scores=scores, control_nodes=())
    assert inventory.score(target(0), target(2)) > inventory.score(target(0), target(1))
    assert inventory.score(target(2), target(0)) == inventory.score(target(0), target(2))


def test_replicas_spread_over_the_gpus_with_most_replicas_free(tmp_path: Path) -> None:
    document = {
        "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}
    }
    inventory = sim_inventory(HostRoot(tmp_path), gpus=4)
    (shared,) = gpu_resources(inventory, config(document)).resources
    uuids = [gpu.whole.uuid for gpu in inventory.gpus]
    # GPU 0 has given away 3 of its 4 replicas already
    available = [d.id for d in shared.devices if d.target.uuid != uuids[0] or d.replica == 3]
    chosen = shared.preferred(available, [], 3)
    assert Counter(i.split("::")[0] for i in chosen) == Counter(uuids[1:])
    assert chosen == shared.preferred(list(reversed(available)), [], 3)


def test_asking_for_more_than_is_available_is_refused(gpus: GpuResource) -> None:
    ids = [d.id for d in gpus.devices]
    with pytest.raises(AllocationError, match="cannot choose 3 devices"):
        gpus.preferred(ids[:2], [], 3)


def test_an_unknown_available_id_is_refused_by_name(gpus: GpuResource) -> None:
    with pytest.raises(AllocationError, match="unknown device id 'GPU-gone'"):
        gpus.preferred(["GPU-gone"], [], 1)
