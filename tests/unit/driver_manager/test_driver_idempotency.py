"""Commands are idempotent by command id, a rollback and a reboot do what the saga needs, and
a restarted agent cleans up after an install it did not finish."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpuop.bus import InMemoryBus
from gpuop.events import driver as dm
from gpuop.events import new_command
from gpuop.host import modules, packages, packaging, system
from gpuop.host.roots import HostRoot
from gpuop.runtime.services import ServiceContext
from gpuop.services.driver_manager import agent as agents
from gpuop.services.driver_manager.config import DriverManagerConfig
from gpuop.services.driver_manager.installing import clean_staging
from gpuop.services.driver_manager.state import StepContext
from gpuop_sim.host.simkernel import SimKernel
from tests.support.driver_manager import (
    BOOT_ID,
    KERNEL,
    NEW,
    NODE,
    OLD,
    TRUSTED,
    Harness,
    rewrite_index,
    running_agent,
    settings_for,
    source_of,
    wait_for_result,
)


async def upgrade(harness: Harness, source: Path) -> None:
    for command in (
        dm.UnloadDriver(component=dm.Component.GPU),
        dm.InstallDriver(component=dm.Component.GPU, version=NEW, source=source_of(source)),
        dm.LoadDriver(component=dm.Component.GPU, version=NEW),
    ):
        answer = await harness.send(command)
        assert not isinstance(answer, dm.DriverFailure), answer


async def test_a_redelivered_command_republishes_its_result_and_does_nothing_else(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    envelope = harness.command(
        dm.InstallDriver(component=dm.Component.GPU, version=NEW, source=source_of(source))
    )
    await harness.bus.publish(envelope)
    first = await harness.result(envelope.id)
    assert first is not None and isinstance(first[1], dm.DriverInstalled)
    installed = packages.package_dir(host, KERNEL, "gpu", NEW)
    shutil.rmtree(installed)  # a second install would put it back

    # the same command again, past the bus's duplicate window (another Nats-Msg-Id)
    subject = f"gpuop.cmd.driver-manager.n1.{dm.InstallDriver.VERB}"
    await harness.bus.publish_raw(subject, envelope.to_bytes(), {"Nats-Msg-Id": "redelivered"})
    await harness.wait_counted("install", "replayed", 1)

    assert not installed.exists()
    assert harness.counted("install", "executed") == 1
    results = [e for e, _ in await harness.events() if e.causationid == envelope.id]
    assert [e.id for e in results] == [agents.result_id(envelope.id)]  # the replay was a duplicate
    record = harness.store.command(envelope.id)
    assert record is not None and record.attempts == 1


async def test_a_command_interrupted_after_its_start_is_run_again(
    harness: Harness, host: HostRoot
) -> None:
    envelope = harness.command(dm.UnloadDriver(component=dm.Component.GPU))
    # the first run recorded its start, unloaded, and died before answering
    harness.store.start(
        envelope.id,
        "unload",
        StepContext(from_version=OLD, modules=("nvidia", "nvidia_uvm"), devices=8),
    )
    for module in ("nvidia_uvm", "nvidia"):
        SimKernel(host).rmmod(module)
    await harness.bus.publish(envelope)
    answer = await harness.result(envelope.id)
    assert answer is not None
    assert answer[1] == dm.DriverUnloaded(
        command_id=envelope.id,
        component=dm.Component.GPU,
        version=OLD,
        modules=("nvidia_uvm", "nvidia"),
    )
    record = harness.store.command(envelope.id)
    assert record is not None and record.attempts == 2 and record.status == "done"


async def test_rollback_returns_to_the_previous_version(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    await upgrade(harness, source)
    answer = await harness.send(dm.RollbackDriver(component=dm.Component.GPU, version=OLD))
    assert answer == dm.DriverRolledBack(
        command_id=harness.sent[-1], component=dm.Component.GPU, version=OLD, from_version=NEW
    )
    assert modules.module_version(host, "nvidia") == OLD
    assert [m.name for m in modules.loaded_modules(host)] == ["nvidia_uvm", "nvidia"]
    assert packages.active_version(host, KERNEL, "gpu") == OLD
    gpu = harness.store.load().component("gpu")
    assert (gpu.loaded, gpu.previous) == (OLD, NEW)


async def test_rollback_to_a_removed_version_reinstalls_it_from_the_source(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    await upgrade(harness, source)
    shutil.rmtree(packages.package_dir(host, KERNEL, "gpu", OLD))
    without = await harness.send(dm.RollbackDriver(component=dm.Component.GPU, version=OLD))
    assert isinstance(without, dm.DriverRollbackFailed)
    assert without.failed_step is dm.DriverStep.INSTALL
    assert modules.module_version(host, "nvidia") == NEW  # untouched
    answer = await harness.send(
        dm.RollbackDriver(component=dm.Component.GPU, version=OLD, source=source_of(source))
    )
    assert isinstance(answer, dm.DriverRolledBack)
    assert modules.module_version(host, "nvidia") == OLD


async def test_reboot_publishes_first_and_honours_the_boot_id(
    harness: Harness, host: HostRoot
) -> None:
    reboot = harness.command(dm.RebootNode(boot_id=BOOT_ID, reason="unload failed"))
    await harness.bus.publish(reboot)
    answer = await harness.result(reboot.id)
    assert answer is not None
    assert answer[1] == dm.RebootStarted(command_id=reboot.id, boot_id=BOOT_ID)
    await harness.wait_counted("reboot", "executed", 1)  # the reboot follows the event
    new_boot = system.boot_id(host)
    assert new_boot is not None and new_boot != BOOT_ID
    assert [m.name for m in modules.loaded_modules(host)] == ["nvidia_uvm", "nvidia"]

    # the same command redelivered after the reboot, and another decided in the old boot:
    # both are dropped, without a reboot and without an answer
    stale = harness.command(dm.RebootNode(boot_id=BOOT_ID))
    subject = "gpuop.cmd.driver-manager.n1.reboot"
    await harness.bus.publish_raw(subject, reboot.to_bytes(), {"Nats-Msg-Id": "again"})
    await harness.bus.publish(stale)
    await harness.wait_counted("reboot", "dropped", 2)
    assert harness.counted("reboot", "replayed") == 0
    assert system.boot_id(host) == new_boot
    assert await harness.result(stale.id, timeout=0.1) is None
    record = harness.store.command(stale.id)
    assert record is not None and record.status == "done" and record.result is None


async def test_a_command_for_a_component_not_managed_here_fails_without_acting(
    bus: InMemoryBus, host: HostRoot, source: Path
) -> None:
    config = DriverManagerConfig(trust=TRUSTED, components=(dm.Component.GPU,))
    async with running_agent(bus, host, source, config) as harness:
        failed = await harness.send(dm.UnloadDriver(component=dm.Component.OFED))
    assert isinstance(failed, dm.DriverUnloadFailed)
    assert failed.reason is dm.UnloadFailureReason.OTHER
    assert failed.message == "ofed is not managed here (this agent manages: gpu)"


def test_start_up_removes_what_an_interrupted_install_left(host: HostRoot) -> None:
    download = host.join("var/lib/gpuop/staging/gpu-580.200.01-abc")
    download.mkdir(parents=True)
    (download / "gpu.tar.gz").write_bytes(b"partial")
    unpacked = packages.component_dir(host, KERNEL, "gpu") / ".staging-580.200.01-abc"
    unpacked.mkdir()
    (unpacked / "nvidia.ko").write_text("{}")
    assert sorted(clean_staging(host)) == sorted([download, unpacked])
    assert not download.exists() and not unpacked.exists()
    assert packages.installed_versions(host, KERNEL, "gpu") == (OLD,)
    assert clean_staging(host) == []


async def test_the_service_main_consumes_its_nodes_commands_and_reports_ready(
    bus: InMemoryBus, host: HostRoot, tmp_path: Path
) -> None:
    config = tmp_path / "driver-manager.yaml"
    config.write_text("components: [gpu]\nunload_poll_seconds: 0.05\n")
    settings = settings_for(host).model_copy(update={"config": config})
    context = ServiceContext(settings, bus, CollectorRegistry())
    task = asyncio.create_task(agents.main(context))
    try:
        async with asyncio.timeout(10):
            while not context.ready:
                await asyncio.sleep(0.01)
        # a command for another node never reaches this agent
        other = dm.UnloadDriver(component=dm.Component.GPU)
        await bus.publish(new_command(other, node="n2", source="/gpuop/test", id="for-n2"))
        mine = new_command(other, node=NODE, source="/gpuop/test", id="for-n1")
        await bus.publish(mine)
        answer = await wait_for_result(bus, "for-n1")
        assert isinstance(answer, dm.DriverUnloaded)
    finally:
        context.stopping.set()
        await task
    assert not context.ready
    state = json.loads(host.join("var/lib/gpuop/driver-state.json").read_text())
    assert list(state["commands"]) == ["for-n1"]
    assert (
        context.registry.get_sample_value(
            "gpuop_driver_commands_total", {"verb": "unload", "outcome": "executed"}
        )
        == 1
    )


async def test_a_build_that_brings_up_no_gpu_fails_validation_and_its_rollback_drops_it(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    defective = packaging.build_package(source, "gpu", NEW, KERNEL, defective=True)
    rewrite_index(source, {defective.path.name: {"sha256": defective.sha256}})
    await upgrade(harness, source)
    failed = await harness.send(
        dm.ValidateDriver(
            component=dm.Component.GPU, version=NEW, expected_devices=8, timeout_seconds=1
        )
    )
    assert isinstance(failed, dm.DriverValidationFailed), failed
    assert failed.reason is dm.LoadFailureReason.NO_DEVICES
    assert "sees 0 devices, 8 expected" in failed.message

    rolled = await harness.send(dm.RollbackDriver(component=dm.Component.GPU, version=OLD))
    assert isinstance(rolled, dm.DriverRolledBack), rolled
    assert packages.installed_versions(host, KERNEL, "gpu") == (OLD,)  # the bad build is gone

    fixed = packaging.build_package(source, "gpu", NEW, KERNEL)
    rewrite_index(source, {fixed.path.name: {"sha256": fixed.sha256}})
    await upgrade(harness, source)  # installs afresh: the fixed package
    validated = await harness.send(
        dm.ValidateDriver(component=dm.Component.GPU, version=NEW, expected_devices=8)
    )
    assert validated == dm.DriverValidated(
        command_id=harness.sent[-1], component=dm.Component.GPU, version=NEW, devices=8
    )


async def test_a_rollback_keeps_the_version_it_returns_to(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    await upgrade(harness, source)
    await harness.send(dm.RollbackDriver(component=dm.Component.GPU, version=OLD))
    again = await harness.send(dm.RollbackDriver(component=dm.Component.GPU, version=OLD))
    assert isinstance(again, dm.DriverRolledBack), again
    assert packages.installed_versions(host, KERNEL, "gpu") == (OLD,)
    assert modules.module_version(host, "nvidia") == OLD
