"""The driver-manager on the real subprocess path: `SubprocessKernelOps` runs stand-in
`modprobe`, `rmmod` and `depmod` from PATH against a simulated host root, so kmod's messages
and exit codes are what the agent reads."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuop.bus import InMemoryBus
from gpuop.events import driver as dm
from gpuop.host import modules, system
from gpuop.host.roots import HostRoot
from gpuop.nvml import open_backend
from gpuop.services.driver_manager.config import DriverManagerConfig, KernelMode
from gpuop_sim.host import standins
from tests.support.driver_manager import (
    BOOT_ID,
    NEW,
    OLD,
    TRUSTED,
    Harness,
    build_source,
    running_agent,
    seed,
    source_of,
)

H200_UUID = "GPU-20bce083-dbf9-2d4f-3c35-c858915accc5"


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HostRoot:
    root = seed(tmp_path / "host")
    bin_dir = standins.install_tools(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GPUOP_HOST_ROOT", str(root.path))
    return root


@pytest.fixture
async def harness(host: HostRoot, tmp_path: Path) -> AsyncIterator[Harness]:
    build_source(tmp_path / "source")
    bus = InMemoryBus()
    await bus.start()
    config = DriverManagerConfig(trust=TRUSTED, kernel=KernelMode.STANDINS)
    try:
        async with running_agent(bus, host, tmp_path / "source", config) as running:
            yield running
    finally:
        await bus.close()


def hold_device_file(root: HostRoot, pid: int, name: str, device: str) -> None:
    """Make the host's `proc` show process `pid` with `device` open, as fuser would see it."""
    fd_dir = root.join(f"proc/{pid}/fd")
    fd_dir.mkdir(parents=True)
    root.join(f"proc/{pid}/comm").write_text(name + "\n")
    os.symlink(device, fd_dir / "3")
    os.symlink("/dev/null", fd_dir / "0")


def loaded(root: HostRoot) -> list[str]:
    return [module.name for module in modules.loaded_modules(root)]


async def test_an_in_use_driver_names_the_processes_holding_it(
    harness: Harness, host: HostRoot
) -> None:
    hold_device_file(host, 4211, "python3", "/dev/nvidia0")
    session = open_backend("sim:8", host_root=host.path, node="n1", holder_id="cuda-job")
    session.init()
    try:
        failed = await harness.send(dm.UnloadDriver(component=dm.Component.GPU, timeout_seconds=2))
    finally:
        session.shutdown()
    assert isinstance(failed, dm.DriverUnloadFailed)
    assert failed.reason is dm.UnloadFailureReason.IN_USE
    assert failed.holding_processes == (dm.Process(pid=4211, name="python3", gpu_uuid=H200_UUID),)
    assert failed.message == "module nvidia is in use; processes: python3[4211]"
    assert loaded(host) == ["nvidia_uvm", "nvidia"]  # rmmod'ed nvidia_uvm is back


async def test_unload_install_load_validate_and_reboot_through_the_tools(
    harness: Harness, host: HostRoot
) -> None:
    unloaded = await harness.send(dm.UnloadDriver(component=dm.Component.GPU))
    assert isinstance(unloaded, dm.DriverUnloaded) and unloaded.version == OLD
    assert loaded(host) == []
    installed = await harness.send(
        dm.InstallDriver(component=dm.Component.GPU, version=NEW, source=source_of(harness.source))
    )
    assert isinstance(installed, dm.DriverInstalled)
    answer = await harness.send(dm.LoadDriver(component=dm.Component.GPU, version=NEW))
    assert answer == dm.DriverLoaded(
        command_id=harness.sent[-1],
        component=dm.Component.GPU,
        version=NEW,
        modules=("nvidia", "nvidia_uvm"),
    )
    validated = await harness.send(dm.ValidateDriver(component=dm.Component.GPU, version=NEW))
    assert isinstance(validated, dm.DriverValidated) and validated.devices == 8

    started = await harness.send(dm.RebootNode(boot_id=BOOT_ID))
    assert isinstance(started, dm.RebootStarted)
    await harness.wait_counted("reboot", "executed", 1)
    assert system.boot_id(host) != BOOT_ID
    assert loaded(host) == ["nvidia_uvm", "nvidia"]
    assert modules.module_version(host, "nvidia") == NEW  # the boot loads the active version


async def test_a_module_the_kernel_refuses_is_a_load_failure(
    harness: Harness, host: HostRoot
) -> None:
    await harness.send(dm.UnloadDriver(component=dm.Component.GPU))
    installed = await harness.send(
        dm.InstallDriver(component=dm.Component.GPU, version=NEW, source=source_of(harness.source))
    )
    assert isinstance(installed, dm.DriverInstalled)
    package = host.join(f"lib/modules/{system.kernel_release(host)}/updates/gpuop/gpu/{NEW}")
    (package / "nvidia.ko").write_bytes(b"\x7fELF")
    failed = await harness.send(dm.LoadDriver(component=dm.Component.GPU, version=NEW))
    assert isinstance(failed, dm.DriverLoadFailed)
    assert failed.reason is dm.LoadFailureReason.MODULE_ERROR
    assert "Exec format error" in failed.message
    rolled_back = await harness.send(dm.RollbackDriver(component=dm.Component.GPU, version=OLD))
    assert isinstance(rolled_back, dm.DriverRolledBack)
    assert modules.module_version(host, "nvidia") == OLD
