"""MIG changes on the simulated H200 (`MigControl`) and `mig_layout.apply`: only the GPUs
whose layout changes are touched, the result is read back, and a failure part way puts back
the layout read at the start, field for field."""

from __future__ import annotations

import pytest

from gpuop.nvml import errors
from gpuop.nvml.mig import MigControl, MigModeState, MigProfile, Placement, fit
from gpuop.nvml.mig_layout import (
    GpuLayout,
    InvalidLayout,
    LayoutInUse,
    MigApplyFailed,
    ModePending,
    apply,
    current_layout,
)
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.clocks import ManualClock

from .conftest import NVML_JSON

BALANCED = GpuLayout.of(True, ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"])
SEVEN = GpuLayout.of(True, ["1g.18gb"] * 7)
OFF = GpuLayout(False)


@pytest.fixture
def nvml(clock: ManualClock):
    sim = SimNvml(4, node="gpu-node-1", clock=clock, recording=NVML_JSON)
    sim.init()
    yield sim
    sim.shutdown()


def profile_id(nvml: SimNvml, name: str) -> int:
    return next(p.profile_id for p in nvml.mig_profiles(0) if p.name == name)


def test_the_simulated_backend_is_a_mig_control(nvml: SimNvml) -> None:
    assert isinstance(nvml, MigControl)


def test_instances_are_created_at_their_placements_with_nvml_ids(nvml: SimNvml) -> None:
    assert nvml.set_mig_mode(0, True).settled
    three = profile_id(nvml, "3g.71gb")
    assert nvml.create_gpu_instance(0, three, Placement(4, 4)) == 2
    assert nvml.create_gpu_instance(0, profile_id(nvml, "1g.18gb"), Placement(0, 1)) == 7
    assert nvml.mig_devices(0) == ()  # no compute instance yet
    assert nvml.create_compute_instance(0, 2) == 0
    (device,) = nvml.mig_devices(0)
    assert (device.profile, device.gpu_instance_id) == ("3g.71gb", 2)
    assert [gi.placement for gi in nvml.gpu_instances(0)] == [Placement(4, 4), Placement(0, 1)]


def test_an_overlapping_instance_fails_as_nvml_does(nvml: SimNvml) -> None:
    nvml.set_mig_mode(0, True)
    nvml.create_gpu_instance(0, profile_id(nvml, "4g.71gb"), Placement(0, 4))
    with pytest.raises(errors.InsufficientResources, match="overlaps"):
        nvml.create_gpu_instance(0, profile_id(nvml, "2g.35gb"), Placement(2, 2))
    with pytest.raises(errors.InvalidArgument, match="cannot start"):
        nvml.create_gpu_instance(0, profile_id(nvml, "2g.35gb"), Placement(6, 2))


def test_mig_mode_cannot_change_under_processes_or_instances(nvml: SimNvml) -> None:
    nvml.start_process(1, 4242, 2**30)
    with pytest.raises(errors.InUse):
        nvml.set_mig_mode(1, True)
    nvml.enable_mig(2, ["7g.141gb"])
    with pytest.raises(errors.InUse, match="destroy them first"):
        nvml.set_mig_mode(2, False)


def test_a_mode_change_can_wait_for_a_reset(nvml: SimNvml) -> None:
    nvml.require_reset_for_mig_mode(0)
    mode = nvml.set_mig_mode(0, True)
    assert (mode.current, mode.pending, mode.settled) == (False, True, False)
    assert nvml.device_info(0).mig_mode_pending is True
    nvml.reset_gpu_mig(0)
    assert nvml.mig_mode(0).current is True


def test_fit_finds_placements_a_first_fit_would_miss(nvml: SimNvml) -> None:
    by_name = {p.name: p for p in nvml.mig_profiles(0)}
    # 3g first at slice 0 leaves no 2g start for the second 2g: the 3g must go to slice 4
    placements = fit([by_name["3g.71gb"], by_name["2g.35gb"], by_name["2g.35gb"]])
    assert placements == (Placement(4, 4), Placement(0, 2), Placement(2, 2))
    assert fit([by_name["4g.71gb"], by_name["3g.71gb"], by_name["1g.18gb"]]) is None


def test_apply_changes_only_the_gpus_whose_layout_differs(nvml: SimNvml) -> None:
    nvml.enable_mig(1, ["1g.18gb"] * 7)
    untouched = nvml.mig_devices(1)
    applied = apply(nvml, {0: BALANCED, 1: SEVEN, 2: OFF})
    assert applied.changed == (0,)
    assert applied.mig_devices == 4 + 7
    assert current_layout(nvml, 0) == BALANCED
    assert nvml.mig_devices(1) == untouched
    assert apply(nvml, {0: BALANCED}).changed == ()


def test_apply_turns_mig_off_again(nvml: SimNvml) -> None:
    apply(nvml, {3: BALANCED})
    assert apply(nvml, {3: OFF}).changed == (3,)
    assert (current_layout(nvml, 3), nvml.mig_devices(3)) == (OFF, ())
    assert nvml.device_info(3).mig_mode_current is False


def test_a_failure_in_the_middle_restores_the_layout_field_for_field(nvml: SimNvml) -> None:
    nvml.enable_mig(0, ["3g.71gb", "4g.71gb"])
    nvml.enable_mig(1, ["2g.35gb", "2g.35gb", "2g.35gb", "1g.18gb"])
    before = {i: (nvml.mig_devices(i), nvml.gpu_instances(i), nvml.device_info(i)) for i in (0, 1)}
    # GPU 0's seven instances are created, then GPU 1's third fails
    nvml.fail_mig_call("create_gpu_instance", errors.NvmlError("injected", code=999), after=7 + 2)
    with pytest.raises(MigApplyFailed, match="injected; the layout before is back") as failed:
        apply(nvml, {0: SEVEN, 1: BALANCED})
    assert failed.value.restored is True
    after = {i: (nvml.mig_devices(i), nvml.gpu_instances(i), nvml.device_info(i)) for i in (0, 1)}
    assert after == before


def test_a_layout_that_cannot_fit_changes_nothing(nvml: SimNvml) -> None:
    nvml.enable_mig(0, ["7g.141gb"])
    before = nvml.mig_devices(0)
    with pytest.raises(InvalidLayout, match="do not fit together") as failed:
        apply(nvml, {0: GpuLayout.of(True, ["4g.71gb", "3g.71gb", "1g.18gb"])})
    assert (failed.value.changed, failed.value.restored) == (False, True)
    with pytest.raises(InvalidLayout, match=r"no MIG profile 1g\.10gb"):
        apply(nvml, {0: GpuLayout.of(True, ["1g.10gb"])})
    with pytest.raises(InvalidLayout, match="no GPU at index"):
        apply(nvml, {9: OFF})
    assert nvml.mig_devices(0) == before


def test_a_mode_change_waiting_for_a_reset_is_reported_pending(nvml: SimNvml) -> None:
    nvml.require_reset_for_mig_mode(2)
    with pytest.raises(ModePending, match=r"GPU \[2\] waits for a GPU reset") as failed:
        apply(nvml, {2: BALANCED})
    assert failed.value.restored is False
    with pytest.raises(ModePending):  # asked again before the reset: still waiting
        apply(nvml, {2: BALANCED})
    nvml.reset_gpu_mig(2)
    assert apply(nvml, {2: BALANCED}).changed == (2,)


def test_nvml_refusing_for_a_busy_gpu_is_in_use_and_restored(nvml: SimNvml) -> None:
    nvml.start_process(0, 77, 2**30)
    with pytest.raises(LayoutInUse) as failed:
        apply(nvml, {0: SEVEN})
    assert failed.value.restored is True
    assert current_layout(nvml, 0) == OFF


def test_a_restore_that_fails_says_so(nvml: SimNvml) -> None:
    nvml.enable_mig(0, ["7g.141gb"])
    # the first compute instance fails, then recreating the old GPU instance fails too
    nvml.fail_mig_call("create_compute_instance", errors.NvmlError("first"))
    nvml.fail_mig_call("create_gpu_instance", errors.NvmlError("again"), after=1)
    with pytest.raises(MigApplyFailed, match="first; restore failed") as failed:
        apply(nvml, {0: SEVEN})
    assert failed.value.restored is False


class WithoutMig(SimNvml):
    """GPU 0 cannot do MIG, as an older GPU answers NVML."""

    def mig_mode(self, index: int) -> MigModeState:
        if index == 0:
            raise errors.NotSupported("nvmlDeviceGetMigMode: not supported")
        return super().mig_mode(index)

    def mig_profiles(self, index: int) -> tuple[MigProfile, ...]:
        return () if index == 0 else super().mig_profiles(index)


def test_a_gpu_that_cannot_do_mig_is_off_and_refuses_to_be_carved(clock: ManualClock) -> None:
    nvml = WithoutMig(2, node="gpu-node-1", clock=clock, recording=NVML_JSON)
    nvml.init()
    assert apply(nvml, {0: OFF}).changed == ()
    with pytest.raises(InvalidLayout, match="GPU 0 cannot do MIG"):
        apply(nvml, {0: SEVEN, 1: SEVEN})
    assert nvml.mig_devices(1) == ()


class LikeARealGpu(SimNvml):
    """Names its MIG profiles only while MIG is on, as NVML does on a real GPU."""

    def mig_profiles(self, index: int) -> tuple[MigProfile, ...]:
        return super().mig_profiles(index) if self.mig_mode(index).current else ()


def test_a_gpu_naming_its_profiles_only_with_mig_on_is_planned_after_the_mode(
    clock: ManualClock,
) -> None:
    nvml = LikeARealGpu(2, node="gpu-node-1", clock=clock, recording=NVML_JSON)
    nvml.init()
    assert nvml.mig_profiles(0) == ()
    assert apply(nvml, {0: BALANCED}).changed == (0,)
    assert current_layout(nvml, 0) == BALANCED
    wrong = GpuLayout.of(True, ["4g.71gb", "3g.71gb", "1g.18gb"])
    with pytest.raises(
        InvalidLayout, match="do not fit together; the layout before is back"
    ) as failed:
        apply(nvml, {1: wrong})
    assert (failed.value.changed, failed.value.restored) == (True, True)
    assert nvml.mig_mode(1) == MigModeState(False, False)
