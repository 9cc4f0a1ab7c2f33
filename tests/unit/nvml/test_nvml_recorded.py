"""RecordedNvml reports exactly what the recorded H200 answered."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpuop.nvml import errors
from gpuop.nvml.devices import ComputeMode
from gpuop.nvml.metrics import ClockEventReason
from gpuop.nvml.protocol import inventory, opened
from gpuop.nvml.recorded import RecordedNvml
from gpuop.nvml.recordings import load_recording
from gpuop.nvml.topology import PcieLevel
from gpuop_sim.nvml.simulated import SimNvml

from .conftest import FIXTURE_DIR, NVML_JSON


@pytest.fixture
def nvml():
    with opened(RecordedNvml(NVML_JSON)) as recorded:
        yield recorded


def test_one_h200_on_driver_580(nvml: RecordedNvml) -> None:
    assert nvml.driver_version() == "580.159.04"
    assert nvml.cuda_driver_version() == "13.0"  # recorded as the integer 13000
    assert nvml.nvml_version() == "13.580.159.04"
    (gpu,) = inventory(nvml)
    assert gpu.name == "NVIDIA H200"
    assert gpu.uuid == "GPU-20bce083-dbf9-2d4f-3c35-c858915accc5"
    assert gpu.compute_capability == "9.0"
    assert gpu.memory_total_bytes == 150_754_820_096
    assert gpu.memory_total_mib == 143_771  # GFD's nvidia.com/gpu.memory
    assert (gpu.pci_vendor, gpu.pci_device) == (0x10DE, 0x2335)
    assert gpu.sysfs_bus_id == "0000:00:06.0"
    assert (gpu.architecture, gpu.numa_node, gpu.mig_mode_current) == ("hopper", None, False)


def test_metrics_are_the_recorded_readings(nvml: RecordedNvml) -> None:
    m = nvml.metrics(0)
    assert (m.memory_used_bytes, m.memory_free_bytes) == (644_939_776, 150_109_880_320)
    assert (m.temperature_celsius, m.power_usage_mw, m.total_energy_mj) == (34, 78_865, 17_856_376)
    assert m.clock_event_reasons is ClockEventReason.GPU_IDLE
    assert nvml.pcie_throughput(0).tx_kilobytes_per_second == 1540
    assert nvml.metrics(0) == m  # a recording does not move


def test_unrecorded_fields_are_not_supported(nvml: RecordedNvml) -> None:
    answers = nvml.field_values(0, [82, 138])
    assert [(a.field_id, a.return_code, a.value) for a in answers] == [(82, 0, 36), (138, 3, None)]


def test_no_nvlink_no_mig_and_no_events(nvml: RecordedNvml) -> None:
    assert nvml.nvlinks(0) == ()
    assert nvml.topology(0, 0).pcie_level is PcieLevel.INTERNAL
    assert nvml.mig_profiles(0) == ()
    assert nvml.mig_devices(0) == ()
    watcher = nvml.watch_events()
    started = time.monotonic()
    assert watcher.wait(30) is None  # as recorded: "no event in 200ms: Timeout"
    assert time.monotonic() - started >= 0.025


def test_queries_need_a_session_and_a_recorded_index() -> None:
    nvml = RecordedNvml(NVML_JSON)
    with pytest.raises(errors.NotInitialized):
        nvml.device_count()
    nvml.init()
    with pytest.raises(errors.InvalidArgument):
        nvml.device_info(1)
    watcher = nvml.watch_events()
    nvml.shutdown()
    with pytest.raises(errors.NotInitialized):
        watcher.wait(1)


def test_an_unusable_recording_is_refused(tmp_path: Path) -> None:
    broken = tmp_path / "nvml.json"
    broken.write_text('{"calls": {}}')
    with pytest.raises(ValueError, match="not a usable NVML recording"):
        RecordedNvml(broken)


def test_the_simulation_seeds_from_the_recorded_h200_by_default() -> None:
    recorded = load_recording(NVML_JSON).devices[0].info
    simulated = SimNvml(1, node="n1")
    with opened(simulated):
        device = simulated.device_info(0)
    assert (device.name, device.memory_total_bytes) == (recorded.name, recorded.memory_total_bytes)


def test_inventory_agrees_with_nvidia_smi_on_the_same_host(nvml: RecordedNvml) -> None:
    smi = ET.parse(FIXTURE_DIR / "nvidia-smi-q.xml").getroot()
    gpu = smi.find("gpu")
    assert gpu is not None

    def read(path: str) -> str:
        return (gpu.findtext(path) or "").strip()

    info = nvml.device_info(0)
    assert nvml.driver_version() == smi.findtext("driver_version")
    assert nvml.cuda_driver_version() == smi.findtext("cuda_version")
    assert (info.name, info.uuid, info.serial) == (
        read("product_name"),
        read("uuid"),
        read("serial"),
    )
    assert info.brand == read("product_brand")
    assert info.architecture == read("product_architecture").lower()
    assert info.pci_bus_id == read("pci/pci_bus_id")
    assert info.pci_device_id == int(read("pci/pci_device_id"), 16)
    assert info.pci_subsystem_id == int(read("pci/pci_sub_system_id"), 16)
    assert str(info.minor_number) == read("minor_number")
    assert info.vbios_version == read("vbios_version")
    assert info.inforom_image_version == read("inforom_version/img_version")
    assert info.board_part_number == read("board_part_number")
    assert f"{info.memory_total_mib} MiB" == read("fb_memory_usage/total")
    assert info.persistence_mode is (read("persistence_mode") == "Enabled")
    assert info.ecc_enabled is (read("ecc_mode/current_ecc") == "Enabled")
    assert info.mig_mode_current is (read("mig_mode/current_mig") == "Enabled")
    assert info.compute_mode is ComputeMode(read("compute_mode").lower())
    assert info.power_limit_mw is not None
    assert f"{info.power_limit_mw / 1000:.2f} W" == read("gpu_power_readings/current_power_limit")
