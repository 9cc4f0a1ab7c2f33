"""A GPU replaced under a simulated node's host root (`gpuop_sim.nvml.sim_replacements`, the
repair knob of a drain-and-replace) has another UUID and serial in the same slot from the
next session of every SimNvml made with that file; the others keep theirs."""

from __future__ import annotations

from pathlib import Path

from gpuop_sim.nvml import sim_replacements
from gpuop_sim.nvml.simulated import SimNvml

from .conftest import NVML_JSON

NODE = "gpu-node-1"


def opened(root: Path) -> SimNvml:
    sim = SimNvml(4, node=NODE, recording=NVML_JSON, replaced=root / sim_replacements.REPLACED)
    sim.init()
    return sim


def test_a_replaced_gpu_has_a_new_identity_in_the_same_slot_from_the_next_session(
    tmp_path: Path,
) -> None:
    nvml = opened(tmp_path)
    before = [nvml.device_info(i) for i in range(4)]

    sim_replacements.replace_gpu(tmp_path, 2)
    assert nvml.device_info(2).uuid == before[2].uuid  # the open session: the board it knew
    nvml.shutdown()
    nvml.init()
    after = nvml.device_info(2)
    assert after.uuid != before[2].uuid and after.serial != before[2].serial
    assert (after.pci_bus_id, after.index) == (before[2].pci_bus_id, 2)
    assert [nvml.device_info(i).uuid for i in (0, 1, 3)] == [before[i].uuid for i in (0, 1, 3)]
    assert opened(tmp_path).device_info(2).uuid == after.uuid  # every service agrees

    sim_replacements.replace_gpu(tmp_path, 2)  # a second new board: yet another identity
    assert opened(tmp_path).device_info(2).uuid not in (before[2].uuid, after.uuid)


def test_a_malformed_file_counts_as_no_replacement(tmp_path: Path) -> None:
    path = tmp_path / sim_replacements.REPLACED
    path.parent.mkdir(parents=True)
    path.write_text('["not", "an object"]')
    first = SimNvml(4, node=NODE, recording=NVML_JSON)
    first.init()
    assert opened(tmp_path).device_info(0).uuid == first.device_info(0).uuid
