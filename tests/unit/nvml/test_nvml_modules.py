"""SimNvml and the kernel: no driver, no NVML; an open session keeps the module in use."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.nvml import errors
from gpuop_sim.nvml.modules import HOLDERS_DIR, HostRootModules, InMemoryModules, ModuleState
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.clocks import ManualClock
from tests.support.hosts import write_host_root

from .conftest import FIXTURE_DIR, NVML_JSON


def sim(modules: ModuleState, clock: ManualClock, holder: str = "telemetry") -> SimNvml:
    return SimNvml(
        2,
        node="gpu-node-1",
        module_state=modules,
        holder_id=holder,
        clock=clock,
        recording=NVML_JSON,
    )


def test_init_fails_while_the_nvidia_module_is_not_loaded(clock: ManualClock) -> None:
    modules = InMemoryModules({"nvidia_uvm": "580.159.04"})
    nvml = sim(modules, clock)
    with pytest.raises(errors.DriverNotLoaded):
        nvml.init()
    assert modules.holders("nvidia") == frozenset()
    modules.load("nvidia", "580.159.04")
    nvml.init()
    assert nvml.driver_version() == "580.159.04"


def test_an_open_session_holds_the_module_until_shutdown(clock: ManualClock) -> None:
    modules = InMemoryModules({"nvidia": "580.159.04"})
    telemetry, plugin = sim(modules, clock, "telemetry"), sim(modules, clock, "device-plugin")
    telemetry.init()
    plugin.init()
    assert modules.holders("nvidia") == {"telemetry", "device-plugin"}
    with pytest.raises(errors.ModuleInUse, match="device-plugin, telemetry"):
        modules.unload("nvidia")
    telemetry.shutdown()
    plugin.shutdown()
    assert modules.holders("nvidia") == frozenset()
    modules.unload("nvidia")
    with pytest.raises(errors.DriverNotLoaded):
        telemetry.init()


def test_the_driver_version_is_the_loaded_modules(clock: ManualClock) -> None:
    modules = InMemoryModules({"nvidia": "570.195.03"})
    nvml = sim(modules, clock)
    nvml.init()
    assert (nvml.driver_version(), nvml.cuda_driver_version()) == ("570.195.03", "12.8")
    assert nvml.nvml_version() == "12.570.195.03"


def test_a_driver_reload_clears_volatile_counters_and_energy(clock: ManualClock) -> None:
    modules = InMemoryModules({"nvidia": "570.195.03"})
    nvml = sim(modules, clock)
    nvml.init()
    nvml.inject_ecc(0, volatile_uncorrected=1, volatile_corrected=4)
    nvml.start_process(0, pid=7, used_memory_bytes=1 << 30)
    clock.advance(60)
    before = nvml.metrics(0)
    nvml.shutdown()
    modules.unload("nvidia")
    modules.load("nvidia", "580.159.04")
    nvml.init()
    after = nvml.metrics(0)
    assert nvml.driver_version() == "580.159.04"
    assert (after.ecc_volatile_uncorrected, after.ecc_volatile_corrected) == (0, 0)
    assert (after.ecc_aggregate_uncorrected, after.ecc_aggregate_corrected) == (1, 4)
    assert after.remapped_rows_pending is False and after.remapped_rows_uncorrectable == 1
    assert after.processes == ()
    assert before.total_energy_mj and (after.total_energy_mj or 0) < before.total_energy_mj


def test_reopening_on_the_same_driver_keeps_the_counters(clock: ManualClock) -> None:
    modules = InMemoryModules({"nvidia": "580.159.04"})
    nvml = sim(modules, clock)
    nvml.init()
    nvml.inject_ecc(1, volatile_corrected=2)
    nvml.shutdown()
    nvml.init()
    assert nvml.metrics(1).ecc_volatile_corrected == 2


def test_a_host_root_session_leaves_a_holder_file_while_open(
    tmp_path: Path, clock: ManualClock
) -> None:
    write_host_root(tmp_path)
    modules = HostRootModules(tmp_path)
    nvml = sim(modules, clock, holder="discovery")
    nvml.init()
    holder = tmp_path / HOLDERS_DIR / "nvidia" / "discovery"
    assert holder.is_file()
    assert modules.holders("nvidia") == {"discovery"}
    assert nvml.driver_version() == "580.159.04"
    nvml.shutdown()
    assert not holder.exists()
    assert modules.holders("nvidia") == frozenset()


def test_a_host_root_without_the_nvidia_module_means_no_driver(
    tmp_path: Path, clock: ManualClock
) -> None:
    write_host_root(tmp_path, loaded=False)
    with pytest.raises(errors.DriverNotLoaded):
        sim(HostRootModules(tmp_path), clock).init()
    assert HostRootModules(tmp_path).holders("nvidia") == frozenset()


def test_without_procfs_sysfs_says_what_is_loaded(tmp_path: Path) -> None:
    (tmp_path / "sys/module/nvidia").mkdir(parents=True)
    modules = HostRootModules(tmp_path)
    assert modules.is_loaded("nvidia")
    assert not modules.is_loaded("nvidia_drm")
    assert modules.version("nvidia") is None


def test_holder_ids_must_be_file_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a short file name"):
        HostRootModules(tmp_path).hold("nvidia", "../escape")


def test_the_recorded_host_root_has_the_nvidia_module_loaded() -> None:
    modules = HostRootModules(FIXTURE_DIR / "hostroot")
    assert modules.is_loaded("nvidia") and modules.is_loaded("nvidia_uvm")
    assert not modules.is_loaded("nvidia_drm")
    assert modules.version("nvidia") == "580.159.04"


def test_a_read_only_host_root_is_opened_holding_nothing(tmp_path: Path) -> None:
    """As the chart's node agents see theirs (read-only mounts): the module is found loaded
    and the session opens; no holder file can be written, so none is, and none is asked for."""
    import subprocess

    source, view = tmp_path / "host", tmp_path / "view"
    (source / "proc").mkdir(parents=True)
    (source / "proc" / "modules").write_text("nvidia 14299136 1 - Live 0x0 (O)\n")
    view.mkdir()
    subprocess.run(["mount", "--bind", str(source), str(view)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
        modules = HostRootModules(view)
        modules.hold("nvidia", "telemetry")
        assert modules.holders("nvidia") == frozenset()
        assert not (source / HOLDERS_DIR).exists()
        (source / "proc" / "modules").write_text("")
        with pytest.raises(errors.DriverNotLoaded):
            modules.hold("nvidia", "telemetry")
    finally:
        subprocess.run(["umount", str(view)], check=True)
