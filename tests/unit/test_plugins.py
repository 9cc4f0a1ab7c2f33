"""The product finds the simulation only through entry points: each kind resolves when
gpuop-sim is installed, and without it the flag that asked says what to install."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop import plugins
from gpuop.cli import main as cli
from gpuop.host.roots import HostRoot
from gpuop.nvml import InvalidBackendSpec, open_backend
from gpuop.runtime.settings import Settings
from gpuop.services.driver_manager import agent
from gpuop.services.driver_manager.config import DriverManagerConfig, KernelMode
from gpuop_sim.host.plugin import SimRebooter, SimulatedNode
from gpuop_sim.host.simkernel import SimKernel
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.driver_manager import TRUSTED


@pytest.fixture
def without_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a node whose image has only gpuop installed."""
    monkeypatch.setattr(plugins, "entry_points", lambda **_: ())


def test_the_simulation_registers_every_kind_of_plugin() -> None:
    assert {"demo", "sim"} <= set(plugins.load_all("gpuop.commands"))
    assert plugins.load("gpuop.nvml", "sim", wanted_for="test") is not None
    host = plugins.load("gpuop.kernels", "simulated", wanted_for="test")(Path("/nonexistent"))
    assert isinstance(host, SimulatedNode) and isinstance(host.kernel, SimKernel)


def test_sim_nvml_and_the_simulated_kernel_come_from_the_plugin(seeded_root: Path) -> None:
    assert isinstance(open_backend("sim:2", host_root=seeded_root, node="n1"), SimNvml)
    settings = Settings(service="driver-manager", node="n1", host_root=seeded_root, nvml="sim:2")
    executor = agent.build_executor(
        settings, DriverManagerConfig(trust=TRUSTED, kernel=KernelMode.SIMULATED)
    )
    assert isinstance(executor.installer.kernel, SimKernel)
    assert isinstance(executor.rebooter, SimRebooter)


@pytest.mark.usefixtures("without_plugins")
def test_without_the_simulation_each_flag_says_what_to_install(seeded_root: Path) -> None:
    with pytest.raises(InvalidBackendSpec, match=r"--nvml 'sim:2'.*pip install gpuop-sim"):
        open_backend("sim:2", host_root=seeded_root, node="n1")
    settings = Settings(service="driver-manager", node="n1", host_root=seeded_root, nvml="real")
    with pytest.raises(plugins.PluginMissing, match=r"kernel mode simulated.*gpuop-sim"):
        agent.build_executor(
            settings, DriverManagerConfig(trust=TRUSTED, kernel=KernelMode.SIMULATED)
        )
    assert "demo" not in cli.parser().format_help()
    assert open_backend("real", host_root=seeded_root, node="n1") is not None


@pytest.fixture
def seeded_root(seeded: HostRoot) -> Path:
    return seeded.path
