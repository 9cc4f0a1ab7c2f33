"""SimNvml fault injection (XID, ECC, a lost GPU) and MIG."""

from __future__ import annotations

import threading
import time

import pytest

from gpuop.nvml import errors
from gpuop.nvml.watching import EccEvent, XidEvent
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.clocks import ManualClock

from .conftest import NVML_JSON

H200_PROFILES = ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]


@pytest.fixture
def nvml(clock: ManualClock):
    sim = SimNvml(8, node="gpu-node-1", clock=clock, recording=NVML_JSON)
    sim.init()
    yield sim
    sim.shutdown()


def test_an_injected_xid_reaches_the_watcher(nvml: SimNvml) -> None:
    watcher = nvml.watch_events()
    nvml.inject_xid(3, 48)
    event = watcher.wait(100)
    assert event == XidEvent(3, nvml.device_info(3).uuid, 48, None, None)
    assert watcher.wait(1) is None


def test_a_wait_returns_none_when_nothing_happens_in_time(nvml: SimNvml) -> None:
    watcher = nvml.watch_events()
    started = time.monotonic()
    assert watcher.wait(30) is None
    assert time.monotonic() - started >= 0.025


def test_a_blocked_wait_wakes_up_for_an_event_from_another_thread(nvml: SimNvml) -> None:
    watcher = nvml.watch_events([0])
    received: list[object] = []
    waiting = threading.Thread(target=lambda: received.append(watcher.wait(5_000)))
    waiting.start()
    time.sleep(0.02)
    started = time.monotonic()
    nvml.inject_xid(0, 79, gpu_instance_id=1, compute_instance_id=0)
    waiting.join()
    assert time.monotonic() - started < 1
    assert received == [XidEvent(0, nvml.device_info(0).uuid, 79, 1, 0)]


def test_a_watcher_sees_only_its_gpus_and_only_while_open(nvml: SimNvml) -> None:
    nvml.inject_xid(0, 31)  # before any watcher: lost, as with NVML
    watcher = nvml.watch_events([1, 2])
    nvml.inject_xid(0, 31)
    nvml.inject_xid(2, 43)
    event = watcher.wait(10)
    assert isinstance(event, XidEvent) and (event.index, event.xid) == (2, 43)
    assert watcher.wait(1) is None
    watcher.close()
    watcher.close()
    with pytest.raises(errors.NotInitialized):
        watcher.wait(1)


def test_shutdown_closes_watchers(nvml: SimNvml) -> None:
    watcher = nvml.watch_events()
    nvml.shutdown()
    with pytest.raises(errors.NotInitialized):
        watcher.wait(1)
    with pytest.raises(errors.NotInitialized):
        nvml.watch_events()


def test_injected_ecc_errors_show_in_counters_and_events(nvml: SimNvml) -> None:
    watcher = nvml.watch_events()
    nvml.inject_ecc(5, volatile_uncorrected=2)
    nvml.inject_ecc(5, volatile_corrected=3)
    m = nvml.metrics(5)
    assert (m.ecc_volatile_uncorrected, m.ecc_aggregate_uncorrected) == (2, 2)
    assert (m.ecc_volatile_corrected, m.ecc_aggregate_corrected) == (3, 3)
    assert (m.remapped_rows_uncorrectable, m.remapped_rows_pending) == (2, True)
    fields = nvml.field_values(5, [3, 4])
    assert [f.value for f in fields] == [3, 2]
    uuid = nvml.device_info(5).uuid
    assert watcher.wait(10) == EccEvent(5, uuid, uncorrectable=True)
    assert watcher.wait(10) == EccEvent(5, uuid, uncorrectable=False)
    assert nvml.metrics(4).ecc_volatile_uncorrected == 0
    with pytest.raises(ValueError, match="negative"):
        nvml.inject_ecc(5, volatile_corrected=-1)


def test_a_lost_gpu_raises_until_it_recovers(nvml: SimNvml) -> None:
    watcher = nvml.watch_events()
    nvml.lose_gpu(6)
    event = watcher.wait(10)
    assert isinstance(event, XidEvent) and (event.index, event.xid) == (6, 79)
    with pytest.raises(errors.GpuLost):
        nvml.metrics(6)
    nvml.metrics(5)
    nvml.recover_gpu(6)
    nvml.metrics(6)


def test_injection_checks_the_index(nvml: SimNvml) -> None:
    with pytest.raises(errors.InvalidArgument):
        nvml.inject_xid(8, 13)


def test_mig_profiles_are_the_h200s(nvml: SimNvml) -> None:
    profiles = nvml.mig_profiles(0)
    assert [p.name for p in profiles] == H200_PROFILES
    full = profiles[-1]
    assert (full.slice_count, full.profile_id, full.instance_count) == (7, 0, 1)
    assert full.memory_bytes <= nvml.device_info(0).memory_total_bytes
    assert nvml.mig_devices(0) == ()


def test_enabling_mig_creates_mig_devices(nvml: SimNvml) -> None:
    nvml.enable_mig(2, ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"])
    info = nvml.device_info(2)
    assert (info.mig_mode_current, info.mig_mode_pending, info.max_mig_devices) == (True, True, 7)
    devices = nvml.mig_devices(2)
    assert [d.profile for d in devices] == ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"]
    assert all(d.uuid.startswith("MIG-") and len(d.uuid) == 40 for d in devices)
    assert len({d.uuid for d in devices}) == 4
    assert len({d.gpu_instance_id for d in devices}) == 4
    assert {d.parent_uuid for d in devices} == {info.uuid}
    assert sum(d.memory_total_bytes for d in devices) <= info.memory_total_bytes
    assert nvml.mig_devices(1) == ()
    assert nvml.device_info(1).mig_mode_current is False
    nvml.disable_mig(2)
    assert nvml.mig_devices(2) == ()
    assert nvml.device_info(2).mig_mode_current is False


def test_a_whole_gpu_instance_is_instance_zero(nvml: SimNvml) -> None:
    nvml.enable_mig(0, ["7g.141gb"])
    (device,) = nvml.mig_devices(0)
    assert (device.gpu_instance_id, device.multiprocessor_count) == (0, 132)


def test_mig_uuids_are_stable(clock: ManualClock) -> None:
    one = SimNvml(8, node="gpu-node-1", clock=clock, recording=NVML_JSON)
    two = SimNvml(8, node="gpu-node-1", clock=clock, recording=NVML_JSON)
    for sim in (one, two):
        sim.init()
        sim.enable_mig(4, ["4g.71gb", "3g.71gb"])
    assert one.mig_devices(4) == two.mig_devices(4)


@pytest.mark.parametrize(
    ("profiles", "complaint"),
    [
        (["3g.71gb", "3g.71gb", "2g.35gb"], "compute slices"),
        (["4g.71gb", "3g.71gb", "1g.18gb"], "compute slices"),
        (["3g.71gb", "1g.35gb", "1g.35gb", "1g.35gb"], "memory slices"),
        (["1g.18gb+me", "1g.18gb+me"], "at most 1"),
        (["1g.10gb"], "not an H200 MIG profile"),
    ],
)
def test_layouts_that_do_not_fit_are_refused(
    nvml: SimNvml, profiles: list[str], complaint: str
) -> None:
    with pytest.raises(ValueError, match=complaint):
        nvml.enable_mig(0, profiles)
    assert nvml.mig_devices(0) == ()
