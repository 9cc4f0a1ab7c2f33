"""Simulated MIG instances live as long as the driver: a reload, a reboot or a GPU reset takes
them away and keeps the MIG mode, in every session sharing the node's MIG file, once."""

from __future__ import annotations

import json
from pathlib import Path

from gpuop.host.roots import HostRoot
from gpuop.nvml.mig import MigModeState
from gpuop_sim.host import simreset
from gpuop_sim.nvml.modules import NVIDIA, HostRootModules, InMemoryModules, ModuleState
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.clocks import ManualClock
from tests.support.hosts import write_host_root

from .conftest import NVML_JSON

VERSION = "580.159.04"


def sim(modules: ModuleState, clock: ManualClock, mig_state: Path | None = None) -> SimNvml:
    return SimNvml(
        2, node="gpu-node-1", module_state=modules, clock=clock, recording=NVML_JSON,
        mig_state=mig_state,
    )  # fmt: skip


def profiles(nvml: SimNvml, index: int) -> list[str]:
    return sorted(d.profile for d in nvml.mig_devices(index))


def reload(modules: InMemoryModules, *sessions: SimNvml) -> None:
    for session in sessions:
        session.shutdown()
    modules.unload(NVIDIA)
    modules.load(NVIDIA, VERSION)
    for session in sessions:
        session.init()


def test_a_driver_reload_clears_the_instances_and_keeps_the_mode(clock: ManualClock) -> None:
    modules = InMemoryModules({NVIDIA: VERSION})
    nvml = sim(modules, clock)
    nvml.init()
    nvml.enable_mig(0, ["3g.71gb", "4g.71gb"])
    nvml.set_mig_mode(1, True)
    nvml.shutdown()
    nvml.init()
    assert profiles(nvml, 0) == ["3g.71gb", "4g.71gb"], "a new session alone changes nothing"

    reload(modules, nvml)

    assert [nvml.mig_mode(i) for i in (0, 1)] == [MigModeState(True, True)] * 2
    assert nvml.gpu_instances(0) == () and nvml.mig_devices(0) == ()
    assert nvml.device_info(0).mig_mode_current is True


def test_instances_made_after_the_reload_stay(clock: ManualClock) -> None:
    modules = InMemoryModules({NVIDIA: VERSION})
    nvml = sim(modules, clock)
    nvml.init()
    nvml.enable_mig(0, ["7g.141gb"])
    reload(modules, nvml)
    nvml.enable_mig(0, ["7g.141gb"])
    nvml.shutdown()
    nvml.init()
    assert profiles(nvml, 0) == ["7g.141gb"]


def test_a_gpu_reset_clears_only_that_gpus_instances(clock: ManualClock) -> None:
    modules = InMemoryModules({NVIDIA: VERSION})
    nvml = sim(modules, clock)
    nvml.init()
    nvml.enable_mig(0, ["3g.71gb"])
    nvml.enable_mig(1, ["3g.71gb"])
    modules.reset(nvml.device_info(1).pci_bus_id)
    assert (profiles(nvml, 0), profiles(nvml, 1)) == (["3g.71gb"], [])
    assert nvml.mig_mode(1) == MigModeState(True, True)


def test_sessions_sharing_the_file_clear_once(tmp_path: Path, clock: ManualClock) -> None:
    """The driver-manager carves again after the reload; the device plugin's session, opened
    later, finds the new instances, not a second clearing."""
    modules = InMemoryModules({NVIDIA: VERSION})
    state = tmp_path / "mig.json"
    manager, plugin = sim(modules, clock, state), sim(modules, clock, state)
    manager.init()
    manager.enable_mig(0, ["3g.71gb", "4g.71gb"])
    manager.shutdown()
    modules.unload(NVIDIA)
    modules.load(NVIDIA, VERSION)
    manager.init()
    assert profiles(manager, 0) == []
    manager.enable_mig(0, ["3g.71gb", "4g.71gb"])
    plugin.init()
    assert profiles(plugin, 0) == ["3g.71gb", "4g.71gb"]
    assert json.loads(state.read_text())[0]["epoch"] == [1, 0]


def test_a_reboot_of_the_host_root_clears_them(tmp_path: Path, clock: ManualClock) -> None:
    write_host_root(tmp_path)
    state = tmp_path / "mig.json"
    nvml = sim(HostRootModules(tmp_path), clock, state)
    nvml.init()
    nvml.enable_mig(0, ["2g.35gb"])
    assert profiles(nvml, 0) == ["2g.35gb"]
    simreset.driver_loaded(HostRoot(tmp_path))  # what SimKernel counts on each load of nvidia
    assert profiles(nvml, 0) == []
    assert nvml.mig_mode(0).current is True


def test_a_file_without_epochs_is_adopted_not_cleared(tmp_path: Path, clock: ManualClock) -> None:
    state = tmp_path / "mig.json"
    SimNvml(2, node="gpu-node-1", recording=NVML_JSON, mig_state=state).enable_mig(0, ["4g.71gb"])
    written = json.loads(state.read_text())
    assert written[0]["epoch"] is None
    for gpu in written:
        del gpu["epoch"]  # as written before epochs
    state.write_text(json.dumps(written))
    modules = InMemoryModules({NVIDIA: VERSION})
    modules.reset()  # loads counted before the file was read
    nvml = sim(modules, clock, state)
    nvml.init()
    assert profiles(nvml, 0) == ["4g.71gb"]


def test_a_change_after_a_reload_starts_from_the_cleared_state(
    tmp_path: Path, clock: ManualClock
) -> None:
    """The first call after the reload changes MIG (no read before it): the stale instances
    are gone first, so the mode can change, as on a freshly loaded driver."""
    modules = InMemoryModules({NVIDIA: VERSION})
    state = tmp_path / "mig.json"
    nvml = sim(modules, clock, state)
    nvml.init()
    nvml.enable_mig(0, ["3g.71gb"])
    reload(modules, nvml)
    assert nvml.set_mig_mode(0, False) == MigModeState(False, False)
    assert json.loads(state.read_text())[0]["instances"] == []
    assert state.with_name("mig.json.lock").exists()  # changes went through the file's lock
