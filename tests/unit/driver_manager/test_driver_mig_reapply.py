"""The MIG layout the driver-manager applied comes back after the driver does: a driver
reload (an upgrade's load, a rollback, the same version again), a GPU reset and a reboot take
the GPUs' instances (the simulated NVML, as a real driver) and the step that brings the driver
back puts them back at their placements, with the CDI spec naming them, before it answers;
when it cannot, the step fails saying why."""

from __future__ import annotations

import json
from pathlib import Path

from gpuop.clocks import VirtualClock
from gpuop.events import driver as dm
from gpuop.events import mig_commands, remediation_commands
from gpuop.host import cdi
from gpuop.host.roots import HostRoot
from gpuop.nvml import opened
from gpuop.services.driver_manager import agent as agents
from gpuop.services.driver_manager.config import DriverManagerConfig
from gpuop.services.driver_manager.mig import LAYOUT_FILE
from gpuop_sim.host.simkernel import SimKernel
from gpuop_sim.nvml.backend import MIG_STATE
from gpuop_sim.nvml.modules import HostRootModules
from gpuop_sim.nvml.sim_gpus import gpu_uuid
from gpuop_sim.nvml.sim_mig_fault import set_fault
from gpuop_sim.nvml.simulated import SimNvml
from tests.support import cdi as support
from tests.support.driver_manager import (
    KERNEL,
    NEW,
    NODE,
    OLD,
    TRUSTED,
    Harness,
    settings_for,
    source_of,
)

GPU = dm.Component.GPU
LAYOUT = (
    mig_commands.GpuMigLayout(
        gpu_index=0,
        mig_enabled=True,
        devices=(
            mig_commands.MigDeviceCount(profile="1g.18gb", count=2),
            mig_commands.MigDeviceCount(profile="2g.35gb", count=1),
            mig_commands.MigDeviceCount(profile="3g.71gb", count=1),
        ),
    ),
    mig_commands.GpuMigLayout(
        gpu_index=1,
        mig_enabled=True,
        devices=(mig_commands.MigDeviceCount(profile="7g.141gb", count=1),),
    ),
)


def mig_names(host: HostRoot) -> list[str]:
    """The MIG devices the CDI spec names."""
    spec = json.loads(cdi.spec_path(host).read_bytes())
    return sorted(d["name"] for d in spec["devices"] if d["name"].startswith("MIG-"))


def instances(host: HostRoot) -> list[list[list[int | bool]]]:
    """The GPU instances in the simulated NVML's shared state, per GPU."""
    return [gpu["instances"] for gpu in json.loads(host.join(MIG_STATE).read_text())]


async def carved(harness: Harness, host: HostRoot) -> tuple[list[str], object]:
    support.install_userspace(host, support.manifest(OLD, KERNEL))
    applied = await harness.send(mig_commands.ApplyMigLayout(config="split", layouts=LAYOUT))
    assert isinstance(applied, mig_commands.MigLayoutApplied), applied
    names = mig_names(host)
    assert len(names) == 5
    return names, instances(host)


async def test_an_upgrades_load_puts_the_layout_back_with_the_same_devices(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    names, before = await carved(harness, host)
    recorded = json.loads(host.join(LAYOUT_FILE).read_text())
    assert recorded["config"] == "split" and len(recorded["gpus"]) == 8

    assert isinstance(await harness.send(dm.UnloadDriver(component=GPU)), dm.DriverUnloaded)
    installed = await harness.send(
        dm.InstallDriver(component=GPU, version=NEW, source=source_of(source))
    )
    assert isinstance(installed, dm.DriverInstalled)
    support.install_userspace(host, support.manifest(NEW, KERNEL))
    loaded = await harness.send(dm.LoadDriver(component=GPU, version=NEW))

    assert isinstance(loaded, dm.DriverLoaded), loaded
    assert instances(host) == before
    assert mig_names(host) == names


async def test_a_reload_at_the_same_version_and_a_rollback_put_it_back(
    harness: Harness, host: HostRoot
) -> None:
    names, before = await carved(harness, host)
    await harness.send(dm.UnloadDriver(component=GPU))
    assert isinstance(
        await harness.send(dm.LoadDriver(component=GPU, version=OLD)), dm.DriverLoaded
    )
    assert (instances(host), mig_names(host)) == (before, names)

    rolled = await harness.send(dm.RollbackDriver(component=GPU, version=OLD))
    assert isinstance(rolled, dm.DriverRolledBack), rolled
    assert (instances(host), mig_names(host)) == (before, names)


async def test_a_reboot_is_caught_up_by_the_validation(harness: Harness, host: HostRoot) -> None:
    names, before = await carved(harness, host)
    SimKernel(host).reboot(load=("nvidia", "nvidia_uvm"))
    plugin = SimNvml(
        8, node=NODE, module_state=HostRootModules(host.path), mig_state=host.join(MIG_STATE)
    )
    with opened(plugin):  # the instances went with the boot, the mode stayed
        assert (plugin.mig_devices(0), plugin.mig_mode(0).current) == ((), True)

    validated = await harness.send(dm.ValidateDriver(component=GPU, version=OLD))

    assert isinstance(validated, dm.DriverValidated), validated
    assert (instances(host), mig_names(host)) == (before, names)


async def test_a_gpu_reset_puts_that_gpus_instances_back(harness: Harness, host: HostRoot) -> None:
    names, before = await carved(harness, host)
    reset = remediation_commands.ResetGpu(gpu_uuids=(gpu_uuid(NODE, 1),), timeout_seconds=30)
    answer = await harness.send(reset)
    assert isinstance(answer, remediation_commands.GpuReset), answer
    assert (instances(host), mig_names(host)) == (before, names)


async def test_a_layout_that_cannot_come_back_fails_the_load(
    harness: Harness, host: HostRoot
) -> None:
    await carved(harness, host)
    await harness.send(dm.UnloadDriver(component=GPU))
    set_fault(host.path, "create_gpu_instance", after=1)

    answer = await harness.send(dm.LoadDriver(component=GPU, version=OLD))

    assert isinstance(answer, dm.DriverLoadFailed), answer
    assert answer.reason is dm.LoadFailureReason.OTHER and answer.retryable
    assert "the MIG config split applied before could not be put back" in answer.message
    assert "GPU 0 has MIG enabled with 3g.71gb, not MIG enabled with 1g.18gb" in answer.message
    again = await harness.send(dm.LoadDriver(component=GPU, version=OLD))  # the fault fired once
    assert isinstance(again, dm.DriverLoaded), again
    assert len(mig_names(host)) == 5


async def test_an_unreadable_record_fails_the_load_and_none_changes_nothing(
    harness: Harness, host: HostRoot
) -> None:
    await harness.send(dm.UnloadDriver(component=GPU))
    assert isinstance(
        await harness.send(dm.LoadDriver(component=GPU, version=OLD)), dm.DriverLoaded
    )
    assert not host.join(MIG_STATE).exists()  # no layout recorded: MIG never touched
    await harness.send(dm.UnloadDriver(component=GPU))
    host.join(LAYOUT_FILE).parent.mkdir(parents=True, exist_ok=True)
    host.join(LAYOUT_FILE).write_text('{"config": "split"}')
    answer = await harness.send(dm.LoadDriver(component=GPU, version=OLD))
    assert isinstance(answer, dm.DriverLoadFailed), answer
    assert "recorded MIG layout" in answer.message and "unreadable" in answer.message


async def test_a_driver_manager_starting_after_a_reboot_puts_it_back(
    harness: Harness, host: HostRoot
) -> None:
    names, before = await carved(harness, host)
    SimKernel(host).reboot(load=("nvidia", "nvidia_uvm"))
    executor = agents.build_executor(
        settings_for(host), DriverManagerConfig(trust=TRUSTED), VirtualClock()
    )
    await executor.catch_up_mig(10)
    assert (instances(host), mig_names(host)) == (before, names)


async def test_starting_without_a_driver_leaves_it_to_the_load(
    harness: Harness, host: HostRoot
) -> None:
    await carved(harness, host)
    SimKernel(host).reboot()  # nothing loaded at boot
    executor = agents.build_executor(
        settings_for(host), DriverManagerConfig(trust=TRUSTED), VirtualClock()
    )
    await executor.catch_up_mig(10)  # no NVML to ask: nothing done, nothing raised
    assert isinstance(
        await harness.send(dm.LoadDriver(component=GPU, version=OLD)), dm.DriverLoaded
    )
    assert len(mig_names(host)) == 5
