"""The cross-process MIG fault knob (`sim_mig_fault`): a fault file under the host root makes
one MIG call of a node fail after a number of successes, counted across every session of
the node, once; a malformed file refuses every MIG write with a reason naming it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuop.nvml import errors
from gpuop.nvml.mig_layout import GpuLayout, MigApplyFailed, apply, current_layout
from gpuop_sim.nvml.sim_mig_fault import MIG_FAULT, clear_fault, set_fault
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.clocks import ManualClock

from .conftest import NVML_JSON

BALANCED = GpuLayout.of(True, ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"])
SEVEN = GpuLayout.of(True, ["1g.18gb"] * 7)


def node(root: Path, clock: ManualClock) -> SimNvml:
    """One session of the node at `root`, as each of its services opens one."""
    sim = SimNvml(
        4,
        node="gpu-node-1",
        clock=clock,
        recording=NVML_JSON,
        mig_state=root / "run/gpuop/sim-nvml/mig.json",
        mig_fault=root / MIG_FAULT,
    )
    sim.init()
    return sim


def test_a_fault_set_from_outside_fails_the_apply_midway_and_it_is_restored(
    tmp_path: Path, clock: ManualClock
) -> None:
    driver_manager, other_service = node(tmp_path, clock), node(tmp_path, clock)
    driver_manager.enable_mig(0, ["3g.71gb", "4g.71gb"])
    driver_manager.enable_mig(1, ["7g.141gb"])
    before = [other_service.mig_devices(i) for i in range(4)]
    set_fault(tmp_path, "create_gpu_instance", after=7 + 2)  # GPU 1's third instance fails
    restored = r"injected fault.*the layout before is back"
    with pytest.raises(MigApplyFailed, match=restored) as failed:
        apply(driver_manager, {0: SEVEN, 1: BALANCED})
    assert failed.value.restored is True
    assert [other_service.mig_devices(i) for i in range(4)] == before
    assert not (tmp_path / MIG_FAULT).exists()  # one-shot
    assert apply(driver_manager, {0: SEVEN}).changed == (0,)


def test_successes_are_counted_across_the_sessions_of_a_node(
    tmp_path: Path, clock: ManualClock
) -> None:
    first, second = node(tmp_path, clock), node(tmp_path, clock)
    set_fault(tmp_path, "set_mig_mode", after=1)
    first.set_mig_mode(2, True)
    with pytest.raises(errors.NvmlError, match="set_mig_mode: injected fault") as failed:
        second.set_mig_mode(3, True)
    assert failed.value.code == 999
    assert second.set_mig_mode(3, True).current is True


def test_other_calls_and_reads_do_not_consume_the_fault(tmp_path: Path, clock: ManualClock) -> None:
    sim = node(tmp_path, clock)
    set_fault(tmp_path, "create_compute_instance")
    apply(sim, {0: GpuLayout(False)})
    sim.mig_devices(0)
    with pytest.raises(MigApplyFailed, match="create_compute_instance: injected fault"):
        apply(sim, {0: BALANCED})
    assert current_layout(sim, 0) == GpuLayout(False)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("create_gpu_instance", "not JSON"),
        ('{"call": "create_gpu_instance"}', "expected"),
        ('{"call": "reboot", "after": 0}', "unknown MIG call 'reboot'"),
        ("{not json", r"not JSON \(Expecting property name.*\): expected"),
        ('{"call": "set_mig_mode", "after": -1}', "after must be a whole number of successes"),
        ('{"call": "set_mig_mode", "after": "2"}', "after must be a whole number of successes"),
    ],
)
def test_a_malformed_fault_file_refuses_every_mig_write_and_stays(
    tmp_path: Path, clock: ManualClock, content: str, reason: str
) -> None:
    sim = node(tmp_path, clock)
    path = tmp_path / MIG_FAULT
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(
        errors.InvalidArgument, match=re.escape(f"simulated MIG fault {path}: ") + reason
    ):
        sim.set_mig_mode(0, True)
    with pytest.raises(errors.InvalidArgument, match=reason):
        sim.set_mig_mode(0, True)
    assert sim.mig_mode(0).current is False  # reads still answer
    clear_fault(tmp_path)
    assert sim.set_mig_mode(0, True).current is True


def test_set_fault_refuses_what_the_nvml_would_refuse(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown MIG call 'reset'"):
        set_fault(tmp_path, "reset")
    with pytest.raises(ValueError, match="whole number"):
        set_fault(tmp_path, "create_gpu_instance", after=-2)
    assert not (tmp_path / MIG_FAULT).exists()
