"""Validation compares the GPU driver's user space with the loaded module: the user space in
use (the `current` link a format 2 install switches), its `libnvidia-ml.so.<version>` and the
driver's own report in procfs must all be the module's version, or validation fails at once
naming both versions."""

from __future__ import annotations

from gpuop.events import driver as dm
from gpuop.host import nvidia
from gpuop.host.roots import HostRoot
from gpuop.services.driver_manager import installing, validating
from tests.support.driver_manager import NEW, OLD, Harness


def user_space(root: HostRoot, version: str, library: str | None = None) -> None:
    """A format 2 user space of `version` (its NVML library named for `library`), in use."""
    lib = installing.userspace_dir(root, "gpu", version) / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    (lib / f"libnvidia-ml.so.{library or version}").write_bytes(b"\x7fELF nvml")
    installing.activate_userspace(root, "gpu", version)


def validate(version: str = OLD) -> dm.ValidateDriver:
    return dm.ValidateDriver(component=dm.Component.GPU, version=version, timeout_seconds=2)


async def test_the_user_space_of_the_loaded_module_validates(
    harness: Harness, host: HostRoot
) -> None:
    user_space(host, OLD)
    answer = await harness.send(validate())
    assert isinstance(answer, dm.DriverValidated), answer
    assert validating.user_space_mismatch(host, OLD) is None


async def test_a_user_space_of_another_version_fails_validation(
    harness: Harness, host: HostRoot
) -> None:
    user_space(host, NEW)
    failed = await harness.send(validate())
    assert isinstance(failed, dm.DriverValidationFailed), failed
    assert failed.reason is dm.LoadFailureReason.VERSION_MISMATCH and not failed.retryable
    assert failed.message == (
        f"the user space in use (opt/gpuop/gpu/current) is {NEW}, the loaded nvidia module is {OLD}"
    )


async def test_an_nvml_library_of_another_version_fails_validation(
    harness: Harness, host: HostRoot
) -> None:
    user_space(host, OLD, library=NEW)
    failed = await harness.send(validate())
    assert isinstance(failed, dm.DriverValidationFailed), failed
    assert failed.reason is dm.LoadFailureReason.VERSION_MISMATCH
    assert f"holds libnvidia-ml.so.{NEW}, the loaded nvidia module is {OLD}" in failed.message


async def test_a_procfs_report_of_another_version_fails_validation(
    harness: Harness, host: HostRoot
) -> None:
    report = host.join(nvidia.VERSION_FILE)
    report.write_text(report.read_text().replace(OLD, NEW))
    failed = await harness.send(validate())
    assert isinstance(failed, dm.DriverValidationFailed), failed
    assert failed.message == (
        f"{nvidia.VERSION_FILE} reports driver {NEW}, the loaded nvidia module is {OLD}"
    )


def test_a_host_without_a_switched_user_space_is_judged_by_procfs_alone(
    host: HostRoot,
) -> None:
    assert installing.active_userspace(host, "gpu") is None
    assert validating.user_space_mismatch(host, OLD) is None
    host.join(nvidia.VERSION_FILE).write_text("garbage\n")
    mismatch = validating.user_space_mismatch(host, OLD)
    assert mismatch is not None and "unreadable" in mismatch
