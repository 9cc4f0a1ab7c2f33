"""Staging a package before the node is cordoned: `StageDriver` fetches, verifies and checks
it without installing anything, every reason the install would fail for fails the stage
instead, and the install that follows takes the staged copy (its digest checked again)
without asking the source."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpuop.clocks import VirtualClock
from gpuop.events import driver as dm
from gpuop.events.driver import InstallFailureReason
from gpuop.host import kmod, modules, packages, packaging
from gpuop.host.errors import KernelToolMissing
from gpuop.host.manifests import Flavour, Role
from gpuop.host.roots import HostRoot
from gpuop.services.driver_manager import installing, staging
from gpuop.services.driver_manager.config import DriverManagerConfig
from gpuop_sim.host import keys, seeding
from tests.support.driver_manager import (
    KERNEL,
    NEW,
    OLD,
    TRUSTED,
    Harness,
    recorded_host,
    source_of,
)
from tests.support.kernel_modules import module_elf

GPU = dm.Component.GPU


def stage(source: Path | str, version: str = NEW, sha256: str | None = None) -> dm.StageDriver:
    return dm.StageDriver(component=GPU, version=version, source=source_of(source, sha256))


def install(source: Path | str, version: str = NEW) -> dm.InstallDriver:
    return dm.InstallDriver(component=GPU, version=version, source=source_of(source))


def nothing_installed(root: HostRoot, version: str = NEW) -> None:
    """The node is as it was: the old driver loaded, the new version not installed."""
    assert [m.name for m in modules.loaded_modules(root)] == ["nvidia_uvm", "nvidia"]
    assert version not in packages.installed_versions(root, KERNEL, "gpu")
    assert packages.active_version(root, KERNEL, "gpu") == OLD


async def test_a_staged_package_installs_without_the_source(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    archive = source / packaging.archive_name("gpu", NEW, KERNEL)
    staged = await harness.send(stage(source))
    assert staged == dm.DriverStaged(
        command_id=harness.sent[-1],
        component=GPU,
        version=NEW,
        sha256=packaging.sha256_of(archive),
    )
    nothing_installed(host)
    kept = staging.directory(host, "gpu", NEW, KERNEL)
    assert (kept / archive.name).read_bytes() == archive.read_bytes()
    # the source goes away between the stage and the install: the staged copy is enough
    shutil.rmtree(source)
    installed = await harness.send(install(source))
    assert isinstance(installed, dm.DriverInstalled), installed
    assert installed.sha256 == staged.sha256
    assert (packages.package_dir(host, KERNEL, "gpu", NEW) / "nvidia.ko").is_file()
    assert not kept.exists()  # the install dropped the copy it used


async def test_a_version_the_source_lacks_fails_the_stage_naming_what_it_has(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    failed = await harness.send(stage(source, "580.210.02"))
    assert isinstance(failed, dm.DriverStageFailed), failed
    assert failed.reason is InstallFailureReason.NOT_FOUND
    assert f"it has: {OLD}, {NEW}" in failed.message
    assert not failed.retryable
    nothing_installed(host, "580.210.02")
    assert not host.join(staging.STAGED).exists()


async def test_a_tampered_package_fails_the_stage_by_its_checksum(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    archive = source / packaging.archive_name("gpu", NEW, KERNEL)
    archive.write_bytes(archive.read_bytes()[:-8] + b"tampered")
    failed = await harness.send(stage(source))
    assert isinstance(failed, dm.DriverStageFailed), failed
    assert failed.reason is InstallFailureReason.VERIFICATION_FAILED
    assert "checksum mismatch" in failed.message
    nothing_installed(host)
    assert staging.find(host, "gpu", NEW, KERNEL) is None
    staging_dir = host.join(installing.STAGING)
    assert not staging_dir.exists() or not any(staging_dir.iterdir())


async def test_a_digest_other_than_the_commands_fails_the_stage(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    failed = await harness.send(stage(source, sha256="0" * 64))
    assert isinstance(failed, dm.DriverStageFailed), failed
    assert failed.reason is InstallFailureReason.VERIFICATION_FAILED
    assert "the command expects " + "0" * 64 in failed.message
    nothing_installed(host)


async def test_a_staged_copy_changed_on_the_host_is_dropped_and_fetched_again(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    staged = await harness.send(stage(source))
    assert isinstance(staged, dm.DriverStaged)
    found = staging.find(host, "gpu", NEW, KERNEL)
    assert found is not None
    copy = staging.archive_of(host, found)
    copy.write_bytes(copy.read_bytes() + b"rot")
    installed = await harness.send(install(source))
    assert isinstance(installed, dm.DriverInstalled), installed
    assert installed.sha256 == staged.sha256  # the source's package, not the rotten copy
    assert staging.find(host, "gpu", NEW, KERNEL) is None


async def test_staging_again_keeps_the_copy_and_a_newer_version_supersedes_it(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    first = await harness.send(stage(source))
    again = await harness.send(stage(source))
    assert isinstance(first, dm.DriverStaged) and isinstance(again, dm.DriverStaged)
    assert again.sha256 == first.sha256
    # OLD runs and is installed: nothing to stage for it
    installed_already = await harness.send(stage(source, OLD))
    assert installed_already == dm.DriverStaged(
        command_id=harness.sent[-1], component=GPU, version=OLD, sha256=None
    )
    assert staging.find(host, "gpu", NEW, KERNEL) is not None
    # staging OLD once it is no longer installed supersedes NEW's copy
    packages_dir = packages.package_dir(host, KERNEL, "gpu", OLD)
    shutil.move(packages_dir, host.path / "aside")
    try:
        replaced = await harness.send(stage(source, OLD))
        assert isinstance(replaced, dm.DriverStaged) and replaced.sha256 is not None
    finally:
        shutil.move(host.path / "aside", packages_dir)
    assert staging.find(host, "gpu", OLD, KERNEL) is not None
    assert staging.find(host, "gpu", NEW, KERNEL) is None


def test_a_staged_record_that_names_something_else_is_no_copy(tmp_path: Path) -> None:
    root = HostRoot(tmp_path / "host")
    kept = staging.directory(root, "gpu", NEW, KERNEL)
    kept.mkdir(parents=True)
    (kept / staging.RECORD).write_text("{not json")
    assert staging.find(root, "gpu", NEW, KERNEL) is None
    wrong = staging.Staged(
        component="gpu", version=OLD, kernel_release=KERNEL, file="a.tar.gz", sha256="a" * 64
    )
    (kept / staging.RECORD).write_text(wrong.model_dump_json())
    assert staging.find(root, "gpu", NEW, KERNEL) is None
    escaping = wrong.model_copy(update={"version": NEW, "file": "../../x.tar.gz"})
    (kept / staging.RECORD).write_text(escaping.model_dump_json())
    assert staging.find(root, "gpu", NEW, KERNEL) is None


# format 2: the modules' checks run at the stage, against the node's kernel

V2_KERNEL = "6.1.0-57-amd64"
V2 = "535.261.03"


@pytest.fixture
def kmod_installed() -> None:
    for tool in ("modinfo", "depmod"):
        try:
            kmod.tool(tool)
        except KernelToolMissing:
            pytest.fail(f"{tool} is not installed: apt-get install kmod")


def v2_source(directory: Path, kernel: str, *, signed: bool = False) -> packaging.BuiltPackage:
    vermagic = f"{kernel} SMP preempt mod_unload modversions "
    files = {
        "modules/nvidia.ko": packaging.PackageContent(
            module_elf("nvidia", vermagic, version=V2, signed=signed), Role.MODULE
        ),
        f"userspace/lib/libnvidia-ml.so.{V2}": packaging.PackageContent(b"nvml", Role.LIBRARY),
    }
    built = packaging.write_package_v2(
        directory,
        component="gpu",
        version=V2,
        flavour=Flavour.OPEN,
        kernel_release=V2_KERNEL,
        files=files,
    )
    packaging.add_to_index(directory, built, keys.SIGNING_KEY)
    return built


def v2_installer(tmp_path: Path) -> installing.Installer:
    root = seeding.seed_host_root(
        tmp_path / "host", recorded_host(), gpu_version=None, kernel_release=V2_KERNEL
    )
    return installing.Installer(
        root, kmod.HostRootKernel(root), DriverManagerConfig(trust=TRUSTED), VirtualClock()
    )


@pytest.mark.usefixtures("kmod_installed")
async def test_modules_built_for_another_kernel_fail_the_stage(tmp_path: Path) -> None:
    installer = v2_installer(tmp_path)
    v2_source(tmp_path / "source", "6.1.0-56-amd64")
    with pytest.raises(installing.InstallError) as error:
        await installer.stage("gpu", V2, source_of(tmp_path / "source"))
    assert error.value.reason is InstallFailureReason.KERNEL_MISMATCH
    assert "built for kernel 6.1.0-56-amd64, the node runs 6.1.0-57-amd64" in error.value.message
    assert staging.find(installer.root, "gpu", V2, V2_KERNEL) is None
    assert not installing.userspace_dir(installer.root, "gpu", V2).exists()


@pytest.mark.usefixtures("kmod_installed")
async def test_unsigned_modules_fail_the_stage_under_lockdown(tmp_path: Path) -> None:
    installer = v2_installer(tmp_path)
    lockdown = installer.root.join("sys/kernel/security/lockdown")
    lockdown.parent.mkdir(parents=True, exist_ok=True)
    lockdown.write_text("none [integrity] confidentiality\n")
    v2_source(tmp_path / "source", V2_KERNEL)
    with pytest.raises(installing.InstallError) as error:
        await installer.stage("gpu", V2, source_of(tmp_path / "source"))
    assert error.value.reason is InstallFailureReason.UNSIGNED_MODULE
    assert staging.find(installer.root, "gpu", V2, V2_KERNEL) is None
    # signed modules stage, and install from the staged copy
    built = v2_source(tmp_path / "source", V2_KERNEL, signed=True)
    staged = await installer.stage("gpu", V2, source_of(tmp_path / "source"))
    assert (staged.sha256, staged.fresh) == (built.sha256, True)
    assert not packages.package_dir(installer.root, V2_KERNEL, "gpu", V2).exists()
    shutil.rmtree(tmp_path / "source")
    done = await installer.install("gpu", V2, source_of(tmp_path / "source"))
    assert (done.sha256, done.fresh) == (built.sha256, True)
    assert packages.package_dir(installer.root, V2_KERNEL, "gpu", V2).is_dir()
