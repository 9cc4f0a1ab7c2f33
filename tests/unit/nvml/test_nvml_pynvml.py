"""PynvmlBackend against a pynvml that answers what the real H200 answered."""

from __future__ import annotations

import sys
import threading
import time
import types

import pynvml
import pytest

from gpuop.nvml import errors
from gpuop.nvml.metrics import ClockEventReason, FieldId
from gpuop.nvml.mig import Placement
from gpuop.nvml.protocol import opened
from gpuop.nvml.real import PynvmlBackend
from gpuop.nvml.recorded import RecordedNvml
from gpuop.nvml.topology import NvLinkRemote, PcieLevel
from gpuop.nvml.watching import EccEvent, XidEvent
from tests.support.fake_pynvml import FakePynvml, Handle

from .conftest import NVML_JSON

UUID = "GPU-20bce083-dbf9-2d4f-3c35-c858915accc5"


@pytest.fixture
def fake() -> FakePynvml:
    return FakePynvml(NVML_JSON)


@pytest.fixture
def backend(fake: FakePynvml):
    with opened(PynvmlBackend(fake.module)) as nvml:
        yield nvml


def test_reports_what_the_recorded_h200_answered(backend: PynvmlBackend) -> None:
    recorded = RecordedNvml(NVML_JSON)
    with opened(recorded):
        assert backend.driver_version() == recorded.driver_version() == "580.159.04"
        assert backend.cuda_driver_version() == recorded.cuda_driver_version() == "13.0"
        assert backend.nvml_version() == recorded.nvml_version() == "13.580.159.04"
        assert backend.device_count() == recorded.device_count() == 1
        assert backend.device_info(0) == recorded.device_info(0)
        assert backend.metrics(0) == recorded.metrics(0)
        assert backend.pcie_throughput(0) == recorded.pcie_throughput(0)
        fields = [
            f["fieldId"] for f in FakePynvml(NVML_JSON).recording["devices"][0]["field_values"]
        ]
        assert backend.field_values(0, fields) == recorded.field_values(0, fields)


def test_every_inventory_field_is_decoded(backend: PynvmlBackend) -> None:
    info = backend.device_info(0)
    assert (info.uuid, info.name, info.serial) == (UUID, "NVIDIA H200", "1653924102546")
    assert (info.pci_bus_id, info.sysfs_bus_id) == ("00000000:00:06.0", "0000:00:06.0")
    assert (info.pci_vendor, info.pci_device, info.pci_subsystem_id) == (0x10DE, 0x2335, 0x18BF10DE)
    assert (info.minor_number, info.memory_total_bytes) == (0, 150754820096)
    assert (info.compute_capability, info.architecture, info.brand) == ("9.0", "hopper", "NVIDIA")
    assert (info.mig_mode_current, info.mig_mode_pending, info.max_mig_devices) == (False, False, 0)
    assert (info.vbios_version, info.inforom_image_version) == ("96.00.A5.00.1A", "G520.0282.02.02")
    assert info.board_part_number == "692-2G520-0282-001"
    assert (info.persistence_mode, info.compute_mode, info.ecc_enabled) == (True, "default", True)
    assert (info.power_limit_mw, info.max_sm_clock_mhz) == (700_000, 1980)


def test_not_supported_answers_become_absent_values(backend: PynvmlBackend) -> None:
    # the recording's `errors`: numa_node, fan_speed, retired_pages_pending, nvlink_state_0
    assert backend.device_info(0).numa_node is None
    metrics = backend.metrics(0)
    assert metrics.fan_speed_percent is None
    assert metrics.retired_pages_pending is None
    assert backend.nvlinks(0) == ()
    # not captured: the v2 memory query (so no reserve), two ECC counters, PCIe RX
    assert metrics.memory_reserved_bytes is None
    assert metrics.memory_used_bytes == 644939776
    assert (metrics.ecc_volatile_corrected, metrics.ecc_aggregate_uncorrected) == (None, None)
    assert backend.pcie_throughput(0).rx_kilobytes_per_second is None


def test_fast_metrics_are_decoded(backend: PynvmlBackend) -> None:
    m = backend.metrics(0)
    assert (m.gpu_utilization_percent, m.memory_utilization_percent) == (0, 0)
    assert (m.temperature_celsius, m.power_usage_mw, m.total_energy_mj) == (34, 78865, 17856376)
    assert (m.sm_clock_mhz, m.memory_clock_mhz, m.performance_state) == (345, 3201, 0)
    assert m.clock_event_reasons == ClockEventReason.GPU_IDLE
    assert (m.ecc_volatile_uncorrected, m.ecc_aggregate_corrected, m.pcie_replay_count) == (0, 0, 0)
    assert (m.remapped_rows_correctable, m.remapped_rows_uncorrectable) == (0, 0)
    assert (m.remapped_rows_pending, m.remapped_rows_failure) == (False, False)
    assert (m.encoder_utilization_percent, m.processes) == (0, ())


def test_memory_v2_supplies_the_reserve_and_excludes_it_from_used(fake: FakePynvml) -> None:
    # nvidia-smi -q on the same host: total 143771 MiB, reserved 616 MiB, used 0, free 143156
    mib = 1024 * 1024
    fake.recording["devices"][0]["memory_info_v2"] = {
        "total": 143771 * mib, "reserved": 616 * mib, "used": 0, "free": 143156 * mib,
    }  # fmt: skip
    with opened(PynvmlBackend(fake.module)) as nvml:
        m = nvml.metrics(0)
    assert (m.memory_used_bytes, m.memory_reserved_bytes) == (0, 616 * mib)


def test_memory_falls_back_to_v1_once_and_stops_asking(fake: FakePynvml) -> None:
    with opened(PynvmlBackend(fake.module)) as nvml:
        nvml.metrics(0)
        nvml.metrics(0)
    assert fake.calls.count("nvmlDeviceGetMemoryInfo") == 1 + 2  # v2 once, then v1 per reading


def test_deprecated_queries_are_not_used(backend: PynvmlBackend, fake: FakePynvml) -> None:
    backend.device_info(0)
    backend.metrics(0)
    assert "nvmlDeviceGetTemperatureV" in fake.calls
    assert "nvmlDeviceGetCurrentClocksEventReasons" in fake.calls
    assert not {"nvmlDeviceGetTemperature", "nvmlDeviceGetCurrentClocksThrottleReasons"} & set(
        fake.calls
    )


def test_fast_metrics_do_not_call_the_slow_queries(
    backend: PynvmlBackend, fake: FakePynvml
) -> None:
    backend.metrics(0)
    assert not {"nvmlDeviceGetPcieThroughput", "nvmlDeviceGetFieldValues"} & set(fake.calls)


def test_field_values_decode_each_value_type(backend: PynvmlBackend) -> None:
    answers = backend.field_values(0, [FieldId.MEMORY_TEMP, FieldId.TOTAL_ENERGY_CONSUMPTION, 66])
    assert [(a.field_id, a.return_code, a.value) for a in answers] == [
        (82, 0, 36),
        (83, 0, 18352867),
        (66, 3, None),
    ]
    assert backend.field_values(0, []) == ()


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, errors.DriverNotLoaded),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, errors.LibraryNotFound),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, errors.DriverMismatch),
        (pynvml.NVML_ERROR_NO_PERMISSION, errors.NoPermission),
        (pynvml.NVML_ERROR_UNKNOWN, errors.NvmlError),
    ],
)
def test_init_failures_map_to_typed_errors(
    fake: FakePynvml, code: int, expected: type[errors.NvmlError]
) -> None:
    fake.fail("nvmlInit", code)
    with pytest.raises(expected) as raised:
        PynvmlBackend(fake.module).init()
    assert type(raised.value) is expected
    assert raised.value.code == code
    assert isinstance(raised.value.__cause__, pynvml.NVMLError)


def test_driver_unavailable_errors_share_a_base(fake: FakePynvml) -> None:
    fake.fail("nvmlInit", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(errors.DriverUnavailable, match="Driver Not Loaded"):
        PynvmlBackend(fake.module).init()


def test_a_lost_gpu_raises_gpu_lost(backend: PynvmlBackend, fake: FakePynvml) -> None:
    fake.fail("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(errors.GpuLost):
        backend.metrics(0)


def test_a_failing_device_enumeration_closes_the_session(fake: FakePynvml) -> None:
    fake.fail("nvmlDeviceGetHandleByIndex", pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(errors.GpuLost):
        PynvmlBackend(fake.module).init()
    assert fake.open_sessions == 0


def test_queries_need_an_open_session_and_a_valid_index(fake: FakePynvml) -> None:
    nvml = PynvmlBackend(fake.module)
    with pytest.raises(errors.NotInitialized):
        nvml.driver_version()
    nvml.init()
    nvml.init()
    assert fake.open_sessions == 1
    with pytest.raises(errors.InvalidArgument, match="index 1"):
        nvml.metrics(1)
    nvml.shutdown()
    nvml.shutdown()
    assert fake.open_sessions == 0
    with pytest.raises(errors.NotInitialized):
        nvml.device_info(0)


def test_a_function_missing_from_the_binding_is_not_supported(fake: FakePynvml) -> None:
    delattr(fake.module, "nvmlDeviceGetBrand")
    with opened(PynvmlBackend(fake.module)) as nvml:
        assert nvml.device_info(0).brand is None


def test_the_default_module_is_the_imported_pynvml(
    fake: FakePynvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    with opened(PynvmlBackend()) as nvml:
        assert nvml.device_info(0).uuid == UUID


def test_event_wait_times_out_with_none_as_recorded(
    backend: PynvmlBackend, fake: FakePynvml
) -> None:
    watcher = backend.watch_events()
    # registered for XID and both ECC kinds, which the H200 supports (0xFF9F)
    assert fake.registered == {0: 0x1 | 0x2 | 0x8}
    assert watcher.wait(10) is None
    watcher.close()


def test_xid_and_ecc_events_are_typed(backend: PynvmlBackend, fake: FakePynvml) -> None:
    def data(kind: int, payload: int = 0, gi: int = 0xFFFFFFFF) -> types.SimpleNamespace:
        return types.SimpleNamespace(
            device=Handle(0), eventType=kind, eventData=payload, gpuInstanceId=gi,
            computeInstanceId=0xFFFFFFFF,
        )  # fmt: skip

    fake.events.extend([data(0x8, 79), data(0x2), data(0x1), data(0x8, 31, gi=3)])
    watcher = backend.watch_events([0])
    assert watcher.wait(10) == XidEvent(0, UUID, 79, None, None)
    assert watcher.wait(10) == EccEvent(0, UUID, uncorrectable=True)
    assert watcher.wait(10) == EccEvent(0, UUID, uncorrectable=False)
    assert watcher.wait(10) == XidEvent(0, UUID, 31, 3, None)


def test_closing_a_watcher_waits_for_the_wait_in_progress(backend: PynvmlBackend) -> None:
    watcher = backend.watch_events()
    outcome: list[object] = []
    waiting = threading.Thread(target=lambda: outcome.append(watcher.wait(200)))
    waiting.start()
    time.sleep(0.02)
    watcher.close()
    waiting.join()
    assert outcome == [None]
    with pytest.raises(errors.NotInitialized):
        watcher.wait(1)


def test_shutdown_closes_open_watchers(backend: PynvmlBackend) -> None:
    watcher = backend.watch_events()
    backend.shutdown()
    with pytest.raises(errors.NotInitialized):
        watcher.wait(1)


def test_nvlinks_are_read_until_the_last_link(backend: PynvmlBackend, fake: FakePynvml) -> None:
    # the recorded H200 VM has no NVLink; these answers have the shape an HGX board gives
    def state(handle: Handle, link: int) -> int:
        if link >= 18:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if link == 17 else 1

    fake.define("nvmlDeviceGetNvLinkState", state)
    fake.define("nvmlDeviceGetNvLinkVersion", lambda h, link: 4)
    fake.define("nvmlDeviceGetNvLinkRemoteDeviceType", lambda h, link: 2)
    fake.define(
        "nvmlDeviceGetNvLinkRemotePciInfo",
        lambda h, link: types.SimpleNamespace(busId=f"00000000:{link % 4 + 5:02X}:00.0"),
    )
    links = backend.nvlinks(0)
    assert len(links) == 18
    assert all(link.active and link.version == 4 for link in links[:17])
    assert links[0].remote is NvLinkRemote.SWITCH
    assert links[0].remote_pci_bus_id == "00000000:05:00.0"
    assert (links[17].active, links[17].remote, links[17].remote_pci_bus_id) == (
        False,
        NvLinkRemote.UNKNOWN,
        None,
    )


def test_topology_of_a_gpu_with_itself_and_unsupported_peers(fake: FakePynvml) -> None:
    fake.recording["calls"]["device_count"] = 2
    fake.recording["devices"].append(dict(fake.recording["devices"][0], uuid="GPU-other"))
    with opened(PynvmlBackend(fake.module)) as nvml:
        assert nvml.topology(0, 0).pcie_level is PcieLevel.INTERNAL
        # recorded host has one GPU: pair queries were never answered
        assert (nvml.topology(0, 1).pcie_level, nvml.topology(0, 1).nvlink) == (None, False)
        fake.define("nvmlDeviceGetTopologyCommonAncestor", lambda a, b: 40)
        fake.define("nvmlDeviceGetP2PStatus", lambda a, b, index: 0)
        assert (nvml.topology(0, 1).pcie_level, nvml.topology(0, 1).nvlink) == (
            PcieLevel.NODE,
            True,
        )


def test_mig_is_empty_while_mig_is_off(backend: PynvmlBackend) -> None:
    assert backend.mig_devices(0) == ()


class MigHandle:
    def __init__(self, slot: int) -> None:
        self.slot = slot


def test_mig_devices_are_named_after_their_instance_profiles(
    backend: PynvmlBackend, fake: FakePynvml
) -> None:
    # The recorded H200 has MIG off; these answers have the shape NVML gives with MIG on:
    # a 1g.18gb instance in slot 0 and a 3g.71gb instance with a 1-slice compute instance in
    # slot 2, the slots between empty.
    profiles = {
        0: dict(id=19, name="MIG 1g.18gb", sliceCount=1, instanceCount=7, memorySizeMB=17920,
                multiprocessorCount=16, copyEngineCount=1, decoderCount=1, encoderCount=0,
                jpegCount=1, ofaCount=0),
        2: dict(id=9, name="MIG 3g.71gb", sliceCount=3, instanceCount=2, memorySizeMB=71680,
                multiprocessorCount=60, copyEngineCount=3, decoderCount=3, encoderCount=0,
                jpegCount=3, ofaCount=0),
        5: dict(id=99, name="MIG 8g", sliceCount=8, instanceCount=0, memorySizeMB=0,
                multiprocessorCount=0, copyEngineCount=0, decoderCount=0, encoderCount=0,
                jpegCount=0, ofaCount=0),
    }  # fmt: skip
    instances = {0: (1, 19, 1, 1, 16, 17920), 2: (2, 9, 3, 1, 16, 71680)}

    def profile_info(handle: Handle, profile: int) -> types.SimpleNamespace:
        if profile not in profiles:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return types.SimpleNamespace(**profiles[profile])

    def mig_handle(handle: Handle, slot: int) -> MigHandle:
        if slot not in instances:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return MigHandle(slot)

    def attributes(mig: MigHandle) -> types.SimpleNamespace:
        _, _, gi_slices, ci_slices, sms, memory = instances[mig.slot]
        return types.SimpleNamespace(
            gpuInstanceSliceCount=gi_slices, computeInstanceSliceCount=ci_slices,
            multiprocessorCount=sms, memorySizeMB=memory, sharedCopyEngineCount=1,
            sharedDecoderCount=1, sharedEncoderCount=0, sharedJpegCount=1, sharedOfaCount=0,
        )  # fmt: skip

    def uuid(handle: Handle | MigHandle) -> str:
        if isinstance(handle, MigHandle):
            return f"MIG-00000000-0000-0000-0000-00000000000{handle.slot}"
        return str(fake.answer(handle.index, "uuid"))

    gpu_instance_ids = {mig: gi for mig, (gi, *_) in instances.items()}
    profile_of = {gi: profile for gi, profile, *_ in instances.values()}
    fake.define("nvmlDeviceGetMigMode", lambda h: [1, 1])
    fake.define("nvmlDeviceGetMaxMigDeviceCount", lambda h: 7)
    fake.define("nvmlDeviceGetGpuInstanceProfileInfo", profile_info)
    fake.define("nvmlDeviceGetMigDeviceHandleByIndex", mig_handle)
    fake.define("nvmlDeviceGetGpuInstanceId", lambda mig: gpu_instance_ids[mig.slot])
    fake.define("nvmlDeviceGetComputeInstanceId", lambda mig: 0)
    fake.define("nvmlDeviceGetAttributes", attributes)
    fake.define("nvmlDeviceGetGpuInstanceById", lambda h, gi: gi)
    fake.define(
        "nvmlGpuInstanceGetInfo",
        lambda gi: types.SimpleNamespace(
            profileId=profile_of[gi], placement=types.SimpleNamespace(start=gi, size=1)
        ),
    )
    fake.define("nvmlDeviceGetUUID", uuid)

    assert [(p.name, p.profile_id, p.instance_count) for p in backend.mig_profiles(0)] == [
        ("1g.18gb", 19, 7),
        ("3g.71gb", 9, 2),
    ]
    first, second = backend.mig_devices(0)
    assert (first.index, first.profile, first.gpu_instance_id, first.uuid[-1]) == (
        0, "1g.18gb", 1, "0",
    )  # fmt: skip
    assert (first.memory_total_bytes, first.multiprocessor_count) == (17920 * 1024 * 1024, 16)
    assert (second.index, second.profile, second.gpu_instance_profile_id) == (2, "1c.3g.71gb", 9)
    assert (second.gpu_instance_slices, second.compute_instance_slices) == (3, 1)
    assert first.placement == Placement(start=1, size=1)
    assert first.parent_uuid == second.parent_uuid == UUID
