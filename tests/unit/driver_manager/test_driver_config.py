"""The `--config` file and what it selects: which kernel operations and which reboot."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuop.bus import InMemoryBus
from gpuop.events import driver as dm
from gpuop.host.roots import HostRoot
from gpuop.host.subprocesses import SubprocessKernelOps
from gpuop.runtime.services import ServiceContext
from gpuop.runtime.settings import SettingsError
from gpuop.services.driver_manager import agent as agents
from gpuop.services.driver_manager import config as configuration
from gpuop.services.driver_manager.config import KernelMode
from gpuop.services.driver_manager.rebooting import HostRebooter
from gpuop_sim.host.plugin import SimRebooter
from gpuop_sim.host.simkernel import SimKernel
from tests.support.driver_manager import settings_for


def test_a_yaml_or_json_file_sets_the_knobs(tmp_path: Path) -> None:
    yaml_file = tmp_path / "dm.yaml"
    yaml_file.write_text(
        "components: [gpu]\nkernel: standins\ndriver_source: http://mirror.local/drivers\n"
        "load_modules:\n  gpu: [nvidia, nvidia_uvm, nvidia_modeset]\n"
    )
    loaded = configuration.load(yaml_file)
    assert loaded.components == (dm.Component.GPU,)
    assert loaded.kernel is KernelMode.STANDINS
    assert loaded.modules_to_load(dm.Component.GPU) == ("nvidia", "nvidia_uvm", "nvidia_modeset")
    assert loaded.modules_to_load(dm.Component.OFED) == ("mlx5_core", "ib_core", "mlx5_ib")
    json_file = tmp_path / "dm.json"
    json_file.write_text('{"max_deliver": 3}')
    assert configuration.load(json_file).max_deliver == 3
    assert configuration.load(None) == configuration.DriverManagerConfig()


def test_a_typo_in_the_file_is_an_error_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "dm.yaml"
    path.write_text("install_pause_secs: 5\n")
    with pytest.raises(SettingsError, match=r"dm.yaml: install_pause_secs: Extra inputs"):
        configuration.load(path)
    path.write_text("- a list\n")
    with pytest.raises(SettingsError, match="expected a mapping"):
        configuration.load(path)


def test_a_simulated_nvml_means_a_simulated_kernel_and_reboot(host: HostRoot) -> None:
    auto = configuration.DriverManagerConfig()
    simulated = agents.build_executor(settings_for(host, "sim:8"), auto)
    assert isinstance(simulated.installer.kernel, SimKernel)
    assert isinstance(simulated.rebooter, SimRebooter)
    real = agents.build_executor(settings_for(host, "real"), auto)
    assert isinstance(real.installer.kernel, SubprocessKernelOps) and real.installer.kernel.chroot
    assert isinstance(real.rebooter, HostRebooter)
    # the real reboot is never run in tests; this is what it would run
    assert real.rebooter.command == ("chroot", str(host.path), "systemctl", "reboot")
    standins = configuration.DriverManagerConfig(kernel=KernelMode.STANDINS)
    tools = agents.build_executor(settings_for(host, "real"), standins)
    assert isinstance(tools.installer.kernel, SubprocessKernelOps)
    assert not tools.installer.kernel.chroot
    assert isinstance(tools.rebooter, SimRebooter)


async def test_a_missing_host_root_is_reported_not_created(tmp_path: Path) -> None:
    missing = HostRoot(tmp_path / "no-such-host")
    bus = InMemoryBus()
    context = ServiceContext(settings_for(missing), bus, CollectorRegistry())
    task = asyncio.create_task(agents.main(context))
    try:
        async with asyncio.timeout(5):
            while "does not exist" not in context.not_ready_reason:
                await asyncio.sleep(0.01)
    finally:
        context.stopping.set()
        await task
    assert not context.ready
    assert not missing.path.exists()


async def test_a_second_agent_on_the_same_host_waits_for_the_first(host: HostRoot) -> None:
    bus = InMemoryBus()
    first = ServiceContext(settings_for(host), bus, CollectorRegistry())
    second = ServiceContext(settings_for(host), bus, CollectorRegistry())
    tasks = [asyncio.create_task(agents.main(first))]
    try:
        async with asyncio.timeout(5):
            while not first.ready:
                await asyncio.sleep(0.01)
        tasks.append(asyncio.create_task(agents.main(second)))
        async with asyncio.timeout(5):
            while "another driver-manager holds" not in second.not_ready_reason:
                await asyncio.sleep(0.01)
        assert not second.ready
    finally:
        first.stopping.set()
        second.stopping.set()
        await asyncio.gather(*tasks)


def test_the_rollback_source_is_a_uri_or_a_source_with_its_keys(tmp_path: Path) -> None:
    path = tmp_path / "dm.yaml"
    path.write_text("driver_source: /srv/drivers\n")
    assert configuration.load(path).driver_source == dm.DriverSource(uri="/srv/drivers")
    key = "RWTXHd9h4gYoMCRTPSqpijdt0H8fptOCa9TyZUmzp1nua3F3NCk+Av3O"
    path.write_text(f"driver_source: {{uri: 'https://mirror/', public_keys: ['{key}']}}\n")
    loaded = configuration.load(path).driver_source
    assert loaded == dm.DriverSource(uri="https://mirror/", public_keys=(key,))
