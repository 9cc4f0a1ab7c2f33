"""SimNvml: distinct simulated H200s whose readings move plausibly and deterministically."""

from __future__ import annotations

import dataclasses
import re
import time

import pytest

from gpuop.nvml import errors
from gpuop.nvml.metrics import DeviceMetrics, FieldId
from gpuop.nvml.protocol import inventory, opened
from gpuop.nvml.recordings import load_recording
from gpuop.nvml.topology import NvLinkRemote, PcieLevel
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.clocks import ManualClock

from .conftest import NVML_JSON

GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
BUS_ID = re.compile(r"^00000000:[0-9A-F]{2}:00\.0$")
RECORDED = load_recording(NVML_JSON).devices[0]


def sim(
    clock: ManualClock,
    gpus: int = 8,
    *,
    node: str = "gpu-node-1",
    seed: int = 0,
    driver_version: str | None = None,
    simulate_latency: bool = False,
) -> SimNvml:
    """An open session on a simulated node."""
    nvml = SimNvml(
        gpus,
        node=node,
        seed=seed,
        driver_version=driver_version,
        clock=clock,
        recording=NVML_JSON,
        simulate_latency=simulate_latency,
    )
    nvml.init()
    return nvml


def test_a_simulated_gpu_is_the_recorded_one_but_for_its_own_ids(clock: ManualClock) -> None:
    gpus = inventory(sim(clock, gpus=2, node="gpu-node-7"))
    recorded = RECORDED.info
    own = {
        "index",
        "uuid",
        "serial",
        "pci_bus_id",
        "minor_number",
        "mig_mode_current",
        "mig_mode_pending",
        "max_mig_devices",
        "numa_node",
        "fabric_clique",
    }
    for gpu in gpus:
        for field in dataclasses.fields(gpu):
            if field.name not in own:
                assert getattr(gpu, field.name) == getattr(recorded, field.name), field.name
        assert (gpu.mig_mode_current, gpu.max_mig_devices, gpu.fabric_clique) == (False, 0, None)
    assert [gpu.minor_number for gpu in gpus] == [0, 1]


def test_eight_gpus_have_distinct_identities(clock: ManualClock) -> None:
    gpus = inventory(sim(clock))
    assert len(gpus) == 8
    assert all(GPU_UUID.match(g.uuid) for g in gpus)
    assert all(BUS_ID.match(g.pci_bus_id) for g in gpus)
    assert len({g.uuid for g in gpus}) == len({g.pci_bus_id for g in gpus}) == 8
    assert len({g.serial for g in gpus}) == 8
    assert all(g.serial and re.fullmatch(r"\d{13}", g.serial) for g in gpus)
    assert [g.minor_number for g in gpus] == list(range(8))
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_every_gpu_is_the_recorded_h200_otherwise(clock: ManualClock) -> None:
    for gpu in inventory(sim(clock)):
        assert (gpu.name, gpu.compute_capability, gpu.architecture) == (
            "NVIDIA H200",
            "9.0",
            "hopper",
        )
        assert gpu.memory_total_bytes == RECORDED.info.memory_total_bytes
        assert gpu.pci_device_id == RECORDED.info.pci_device_id
        assert gpu.vbios_version == RECORDED.info.vbios_version


def test_identity_depends_on_node_and_index_only(clock: ManualClock) -> None:
    first = [g.uuid for g in inventory(sim(clock))]
    again = [g.uuid for g in inventory(sim(clock, seed=7))]
    other = [g.uuid for g in inventory(sim(clock, node="gpu-node-2"))]
    assert first == again
    assert not set(first) & set(other)


def test_versions_are_the_recorded_drivers(clock: ManualClock) -> None:
    nvml = sim(clock)
    assert (nvml.driver_version(), nvml.cuda_driver_version(), nvml.nvml_version()) == (
        "580.159.04",
        "13.0",
        "13.580.159.04",
    )


def test_a_configured_driver_version_brings_its_cuda_version(clock: ManualClock) -> None:
    nvml = sim(clock, driver_version="570.195.03")
    assert (nvml.driver_version(), nvml.cuda_driver_version()) == ("570.195.03", "12.8")
    nvml.shutdown()
    nvml.set_driver_version("580.159.04")
    nvml.init()
    assert nvml.cuda_driver_version() == "13.0"


def test_readings_start_from_the_recording(clock: ManualClock) -> None:
    m = sim(clock).metrics(3)
    r = RECORDED.metrics
    assert (m.temperature_celsius, m.power_usage_mw, m.total_energy_mj) == (
        r.temperature_celsius,
        r.power_usage_mw,
        r.total_energy_mj,
    )
    # the recording's v1 "used", with nothing running, is the driver's reserve
    assert (m.memory_used_bytes, m.memory_reserved_bytes) == (0, r.memory_used_bytes)


def test_values_move_but_stay_in_bounds(clock: ManualClock) -> None:
    nvml = sim(clock)
    limit = RECORDED.info.power_limit_mw
    assert limit is not None and RECORDED.metrics.power_usage_mw is not None
    idle = RECORDED.metrics.power_usage_mw
    total = RECORDED.info.memory_total_bytes
    history: dict[int, list[DeviceMetrics]] = {i: [] for i in range(8)}
    for _ in range(720):  # two simulated hours, read every 10 s
        clock.advance(10)
        for index in range(8):
            history[index].append(nvml.metrics(index))
    for readings in history.values():
        for m in readings:
            assert m.gpu_utilization_percent is not None and 0 <= m.gpu_utilization_percent <= 100
            assert m.power_usage_mw is not None and 0.9 * idle <= m.power_usage_mw <= limit
            assert m.temperature_celsius is not None and 25 <= m.temperature_celsius <= 90
            assert m.memory_used_bytes is not None and m.memory_used_bytes >= 0
            assert m.memory_free_bytes is not None and m.memory_reserved_bytes is not None
            assert m.memory_used_bytes + m.memory_free_bytes + m.memory_reserved_bytes == total
        energy = [m.total_energy_mj or 0 for m in readings]
        assert energy == sorted(energy) and energy[-1] > energy[0]
        assert len({m.gpu_utilization_percent for m in readings}) > 5
        assert len({m.power_usage_mw for m in readings}) > 5
        assert len({m.temperature_celsius for m in readings}) > 3
        assert len({m.memory_used_bytes for m in readings}) > 5
    busy = [m for readings in history.values() for m in readings if m.gpu_utilization_percent]
    assert busy and max(m.sm_clock_mhz or 0 for m in busy) == RECORDED.info.max_sm_clock_mhz


def test_energy_accrues_at_the_current_draw(clock: ManualClock) -> None:
    nvml = sim(clock, gpus=1)
    before = nvml.metrics(0)
    clock.advance(1)
    after = nvml.metrics(0)
    assert before.total_energy_mj is not None and after.total_energy_mj is not None
    assert after.total_energy_mj - before.total_energy_mj == after.power_usage_mw


def test_readings_do_not_depend_on_how_often_they_are_taken() -> None:
    sparse, dense = ManualClock(), ManualClock()
    rare, often = sim(sparse), sim(dense)
    for _ in range(300):
        dense.advance(1)
        often.metrics(2)
    sparse.advance(300)
    assert rare.metrics(2) == often.metrics(2)


def test_the_seed_changes_the_walk(clock: ManualClock) -> None:
    one, two = sim(clock, seed=1), sim(clock, seed=2)
    clock.advance(600)
    assert [one.metrics(i) for i in range(8)] != [two.metrics(i) for i in range(8)]


def test_processes_show_with_their_memory(clock: ManualClock) -> None:
    nvml = sim(clock, gpus=2)
    nvml.start_process(1, pid=4242, used_memory_bytes=8 << 30)
    m = nvml.metrics(1)
    assert [(p.pid, p.used_memory_bytes) for p in m.processes] == [(4242, 8 << 30)]
    assert m.memory_used_bytes is not None and m.memory_used_bytes >= 8 << 30
    nvml.end_process(1, 4242)
    assert nvml.metrics(1).processes == ()


def test_field_values_follow_the_state(clock: ManualClock) -> None:
    nvml = sim(clock)
    clock.advance(120)
    m = nvml.metrics(0)
    fields = {
        f.field_id: f
        for f in nvml.field_values(
            0,
            [
                FieldId.TOTAL_ENERGY_CONSUMPTION,
                FieldId.POWER_INSTANT,
                FieldId.MEMORY_TEMP,
                FieldId.NVLINK_THROUGHPUT_DATA_TX,
                FieldId.NVLINK_BANDWIDTH_C0_TOTAL,
            ],
        )
    }
    assert fields[83].value == m.total_energy_mj
    assert fields[186].value == m.power_usage_mw
    assert fields[82].value == (m.temperature_celsius or 0) + 2
    assert isinstance(fields[138].value, int) and fields[138].return_code == 0
    assert (fields[66].return_code, fields[66].value) == (3, None)
    single = sim(clock, gpus=1)
    assert single.field_values(0, [FieldId.NVLINK_THROUGHPUT_DATA_TX])[0].return_code == 3


def test_slow_queries_can_cost_what_they_cost_on_the_h200(clock: ManualClock) -> None:
    nvml = sim(clock, gpus=1, simulate_latency=True)
    started = time.perf_counter()
    throughput = nvml.pcie_throughput(0)
    assert time.perf_counter() - started >= 0.02
    assert throughput.tx_kilobytes_per_second == 1540  # idle, as recorded


def test_hgx_wiring_and_numa(clock: ManualClock) -> None:
    nvml = sim(clock)
    links = nvml.nvlinks(5)
    assert len(links) == 18
    assert all(link.active and link.remote is NvLinkRemote.SWITCH for link in links)
    assert all(nvml.topology(a, b).nvlink for a in range(8) for b in range(8) if a != b)
    assert nvml.topology(0, 1).pcie_level is PcieLevel.MULTIPLE
    assert nvml.topology(0, 3).pcie_level is PcieLevel.NODE
    assert nvml.topology(3, 4).pcie_level is PcieLevel.SYSTEM
    assert nvml.topology(2, 2).pcie_level is PcieLevel.INTERNAL


def test_a_single_gpu_node_has_no_nvlink(clock: ManualClock) -> None:
    nvml = sim(clock, gpus=1)
    assert nvml.nvlinks(0) == ()
    assert nvml.device_info(0).numa_node == 0


def test_sixteen_gpus_form_two_nvlink_boards(clock: ManualClock) -> None:
    nvml = sim(clock, gpus=16)
    assert len({g.pci_bus_id for g in inventory(nvml)}) == 16
    assert nvml.topology(0, 7).nvlink and not nvml.topology(7, 8).nvlink


def test_session_rules(clock: ManualClock) -> None:
    nvml = SimNvml(2, clock=clock, recording=NVML_JSON)
    with pytest.raises(errors.NotInitialized):
        nvml.metrics(0)
    with opened(nvml), pytest.raises(errors.InvalidArgument):
        nvml.device_info(2)
    with pytest.raises(ValueError, match="1 to 64"):
        SimNvml(0)
    with pytest.raises(ValueError, match="1 to 64"):
        SimNvml(65)
