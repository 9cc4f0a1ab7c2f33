"""The driver-manager's steps on a simulated H200 host, driven through the bus: the upgrade
path a saga takes, and each failure that must leave the old driver running."""

from __future__ import annotations

import json
from pathlib import Path

from gpuop.events import driver as dm
from gpuop.host import modules, nvidia, packages, packaging
from gpuop.host.roots import HostRoot
from gpuop.nvml import open_backend
from gpuop_sim.host.simkernel import SimKernel
from tests.support.driver_manager import KERNEL, NEW, OLD, SAGA, Harness, rewrite_index, source_of


def loaded(root: HostRoot) -> list[str]:
    return [module.name for module in modules.loaded_modules(root)]


def assert_old_driver_intact(root: HostRoot) -> None:
    assert loaded(root) == ["nvidia_uvm", "nvidia"]
    driver = nvidia.driver_version(root)
    assert driver is not None and driver.version == OLD
    assert packages.active_version(root, KERNEL, "gpu") == OLD
    assert NEW not in packages.installed_versions(root, KERNEL, "gpu")
    staging = root.join("var/lib/gpuop/staging")
    assert not staging.exists() or not any(staging.iterdir())
    assert not list(packages.component_dir(root, KERNEL, "gpu").glob(".staging-*"))


async def test_unload_install_load_validate_upgrades_to_the_new_version(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    archive = source / packaging.archive_name("gpu", NEW, KERNEL)
    unloaded = await harness.send(dm.UnloadDriver(component=dm.Component.GPU))
    assert unloaded == dm.DriverUnloaded(
        command_id=harness.sent[-1],
        component=dm.Component.GPU,
        version=OLD,
        modules=("nvidia_uvm", "nvidia"),
    )
    assert loaded(host) == []

    installed = await harness.send(
        dm.InstallDriver(component=dm.Component.GPU, version=NEW, source=source_of(source))
    )
    assert isinstance(installed, dm.DriverInstalled)
    assert installed.sha256 == packaging.sha256_of(archive)
    assert (packages.package_dir(host, KERNEL, "gpu", NEW) / "nvidia.ko").is_file()
    assert packages.active_version(host, KERNEL, "gpu") == OLD  # installing selects nothing

    answer = await harness.send(dm.LoadDriver(component=dm.Component.GPU, version=NEW))
    assert answer == dm.DriverLoaded(
        command_id=harness.sent[-1],
        component=dm.Component.GPU,
        version=NEW,
        modules=("nvidia", "nvidia_uvm"),
    )
    assert modules.module_version(host, "nvidia_uvm") == NEW
    assert packages.active_version(host, KERNEL, "gpu") == NEW

    validated = await harness.send(dm.ValidateDriver(component=dm.Component.GPU, version=NEW))
    assert validated == dm.DriverValidated(
        command_id=harness.sent[-1], component=dm.Component.GPU, version=NEW, devices=8
    )
    assert SimKernel(host).holders("nvidia") == ()  # validation closed its NVML session

    state = json.loads(host.join("var/lib/gpuop/driver-state.json").read_text())
    gpu = state["components"]["gpu"]
    assert (gpu["loaded"], gpu["previous"], gpu["active"]) == (NEW, OLD, NEW)
    assert gpu["installed"] == [OLD, NEW]
    assert gpu["devices"] == 8
    assert gpu["packages"] == {NEW: installed.sha256}
    assert all(record["status"] == "done" for record in state["commands"].values())


async def test_results_carry_the_command_and_the_saga(harness: Harness) -> None:
    envelope = harness.command(dm.UnloadDriver(component=dm.Component.GPU))
    await harness.bus.publish(envelope)
    answer = await harness.result(envelope.id)
    assert answer is not None
    result, _ = answer
    assert (result.causationid, result.correlationid) == (envelope.id, SAGA)
    assert result.subject == "n1" and result.source == "/gpuop/driver-manager/n1"


async def test_an_open_nvml_session_keeps_the_driver_in_use(
    harness: Harness, host: HostRoot
) -> None:
    session = open_backend("sim:8", host_root=host.path, node="n1", holder_id="telemetry")
    session.init()
    try:
        failed = await harness.send(dm.UnloadDriver(component=dm.Component.GPU, timeout_seconds=30))
    finally:
        session.shutdown()
    assert isinstance(failed, dm.DriverUnloadFailed)
    assert failed.reason is dm.UnloadFailureReason.IN_USE
    assert "module nvidia is in use by: telemetry" in failed.message
    assert failed.retryable
    assert_old_driver_intact(host)  # nvidia_uvm, removed first, is loaded again

    unloaded = await harness.send(dm.UnloadDriver(component=dm.Component.GPU))
    assert isinstance(unloaded, dm.DriverUnloaded)


async def test_a_dependent_module_outside_the_component_is_named_as_holder(
    harness: Harness, host: HostRoot
) -> None:
    kernel = SimKernel(host)
    package = packages.package_dir(host, KERNEL, "gpu", OLD)
    standin = packages.ModuleStandin("nvidia_fs", OLD, KERNEL, depends=("nvidia",))
    (package / "nvidia_fs.ko").write_bytes(standin.encode())
    kernel.run_depmod()
    kernel.modprobe("nvidia_fs")
    failed = await harness.send(dm.UnloadDriver(component=dm.Component.GPU, timeout_seconds=2))
    assert isinstance(failed, dm.DriverUnloadFailed)
    assert failed.reason is dm.UnloadFailureReason.IN_USE
    assert failed.holding_modules == ("nvidia_fs",)
    assert "nvidia_uvm" in loaded(host)


async def test_a_checksum_mismatch_leaves_the_old_driver_intact(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    archive = source / packaging.archive_name("gpu", NEW, KERNEL)
    archive.write_bytes(archive.read_bytes()[:-8] + b"tampered")
    failed = await harness.send(
        dm.InstallDriver(component=dm.Component.GPU, version=NEW, source=source_of(source))
    )
    assert isinstance(failed, dm.DriverInstallFailed)
    assert failed.reason is dm.InstallFailureReason.VERIFICATION_FAILED
    assert "checksum mismatch" in failed.message and not failed.retryable
    assert_old_driver_intact(host)


async def test_a_digest_other_than_the_commands_is_refused(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    failed = await harness.send(
        dm.InstallDriver(
            component=dm.Component.GPU, version=NEW, source=source_of(source, "0" * 64)
        )
    )
    assert isinstance(failed, dm.DriverInstallFailed)
    assert failed.reason is dm.InstallFailureReason.VERIFICATION_FAILED
    assert "the command expects 0000" in failed.message
    assert_old_driver_intact(host)


async def test_no_build_for_the_running_kernel(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    rewrite_index(
        source, {packaging.archive_name("gpu", NEW, KERNEL): {"kernel_release": "6.8.0-1-generic"}}
    )
    failed = await harness.send(
        dm.InstallDriver(component=dm.Component.GPU, version=NEW, source=source_of(source))
    )
    assert isinstance(failed, dm.DriverInstallFailed)
    assert failed.reason is dm.InstallFailureReason.NOT_FOUND
    assert f"no build for kernel {KERNEL} (it has builds for: 6.8.0-1-generic)" in failed.message
    assert_old_driver_intact(host)


async def test_an_unknown_version(harness: Harness, source: Path) -> None:
    failed = await harness.send(
        dm.InstallDriver(component=dm.Component.GPU, version="999.1", source=source_of(source))
    )
    assert isinstance(failed, dm.DriverInstallFailed)
    assert failed.reason is dm.InstallFailureReason.NOT_FOUND
    assert f"no such version (it has: {OLD}, {NEW})" in failed.message


async def test_an_unreadable_archive_is_a_clear_failure(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    archive = source / packaging.archive_name("gpu", NEW, KERNEL)
    archive.write_bytes(b"this is not a gzip-compressed tar at all")
    rewrite_index(source, {archive.name: {"sha256": packaging.sha256_of(archive)}})
    failed = await harness.send(
        dm.InstallDriver(component=dm.Component.GPU, version=NEW, source=source_of(source))
    )
    assert isinstance(failed, dm.DriverInstallFailed)
    assert failed.reason is dm.InstallFailureReason.OTHER
    assert f"package archive {archive.name} is unreadable" in failed.message
    assert_old_driver_intact(host)


async def test_load_refuses_a_version_that_is_not_installed(harness: Harness) -> None:
    await harness.send(dm.UnloadDriver(component=dm.Component.GPU))
    failed = await harness.send(dm.LoadDriver(component=dm.Component.GPU, version=NEW))
    assert isinstance(failed, dm.DriverLoadFailed)
    assert failed.reason is dm.LoadFailureReason.MODULE_ERROR
    assert f"gpu {NEW} is not installed for kernel {KERNEL} (installed: {OLD})" in failed.message


async def test_load_over_another_running_version_is_a_mismatch(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    await harness.send(
        dm.InstallDriver(component=dm.Component.GPU, version=NEW, source=source_of(source))
    )
    failed = await harness.send(dm.LoadDriver(component=dm.Component.GPU, version=NEW))
    assert isinstance(failed, dm.DriverLoadFailed)
    assert failed.reason is dm.LoadFailureReason.VERSION_MISMATCH
    assert packages.active_version(host, KERNEL, "gpu") == OLD


async def test_validation_checks_version_and_device_count(harness: Harness) -> None:
    wrong = await harness.send(dm.ValidateDriver(component=dm.Component.GPU, version=NEW))
    assert isinstance(wrong, dm.DriverValidationFailed)
    assert wrong.reason is dm.LoadFailureReason.VERSION_MISMATCH
    short = await harness.send(
        dm.ValidateDriver(
            component=dm.Component.GPU, version=OLD, expected_devices=9, timeout_seconds=3
        )
    )
    assert isinstance(short, dm.DriverValidationFailed)
    assert short.reason is dm.LoadFailureReason.NO_DEVICES
    assert short.message == "the gpu driver sees 8 devices, 9 expected"
    await harness.send(dm.UnloadDriver(component=dm.Component.GPU))
    absent = await harness.send(dm.ValidateDriver(component=dm.Component.GPU, version=OLD))
    assert isinstance(absent, dm.DriverValidationFailed)
    assert absent.reason is dm.LoadFailureReason.MODULE_ERROR
