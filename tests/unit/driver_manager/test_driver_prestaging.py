"""An install pre-stages the version for every other kernel of the host (the one a pending
reboot boots), so a rebooted node comes up with its driver; a kernel the source has no
package for, or whose package fails a check, is reported in `DriverInstalled`, never fatal."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gpuop.events import Event
from gpuop.events import driver as dm
from gpuop.host import modules, packages, packaging
from gpuop.host.roots import HostRoot
from gpuop.services.driver_manager.state import PrestagedKernel
from gpuop_sim.host import keys
from gpuop_sim.host.simkernel import SimKernel
from tests.support.driver_manager import KERNEL, NEW, OLD, Harness, source_of

GPU = dm.Component.GPU
NEXT = "6.18.50-fc-v660-gpu"
"""A newer kernel installed on the host, booted at the next reboot."""
BARE = "6.18.49-fc-v659-gpu"
"""Another one the source has no package for."""
LATER = "6.18.51-fc-v661-gpu"
"""A third kernel, installed without any GPU driver."""


def install(source: Path) -> dm.InstallDriver:
    return dm.InstallDriver(component=GPU, version=NEW, source=source_of(source))


def kernel_installed(root: HostRoot, release: str) -> None:
    (root.join(f"lib/modules/{release}") / "kernel").mkdir(parents=True)


def with_next_kernel(source: Path, *, lying: bool = False, also: tuple[str, ...] = ()) -> None:
    """The test source plus NEW built for NEXT (and for each kernel in `also`); `lying`:
    the index lists for NEXT the archive built for the running kernel (its manifest names
    that kernel)."""
    index = json.loads((source / packaging.INDEX).read_text())
    for release in (NEXT, *also):
        entry = packaging.build_package(source, "gpu", NEW, release).index_entry()
        if lying and release == NEXT:
            running = source / packaging.archive_name("gpu", NEW, KERNEL)
            entry |= {"file": running.name, "sha256": packaging.sha256_of(running)}
        index["packages"].append(entry)
    (source / packaging.INDEX).write_text(json.dumps(index))
    packaging.sign_driver_source(source, keys.SIGNING_KEY)


def old_driver_on(root: HostRoot, release: str) -> None:
    """`release` installed with OLD active, as a node's earlier rollout left it."""
    kernel_installed(root, release)
    packages.install_standins(root, "gpu", OLD, release)
    packages.select_version(root, release, "gpu", OLD)


async def upgrade_and_roll_back(harness: Harness, source: Path) -> Event:
    for command in (
        dm.UnloadDriver(component=GPU),
        install(source),
        dm.LoadDriver(component=GPU, version=NEW),
    ):
        answer = await harness.send(command)
        assert not isinstance(answer, dm.DriverFailure), answer
    return await harness.send(dm.RollbackDriver(component=GPU, version=OLD))


def boot(root: HostRoot, release: str) -> None:
    root.join("proc/sys/kernel/osrelease").write_text(release + "\n")
    SimKernel(root).reboot(load=("nvidia",))


async def test_an_install_prestages_every_other_kernel_the_source_has(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    kernel_installed(host, NEXT)
    kernel_installed(host, BARE)
    with_next_kernel(source)
    answer = await harness.send(
        dm.InstallDriver(component=GPU, version=NEW, source=source_of(source))
    )
    assert isinstance(answer, dm.DriverInstalled), answer
    assert answer.prestaged_kernels == (NEXT,)
    assert answer.kernels_without_package == (BARE,)
    assert (packages.package_dir(host, NEXT, "gpu", NEW) / "nvidia.ko").is_file()
    assert packages.active_version(host, NEXT, "gpu") == NEW
    assert packages.installed_versions(host, BARE, "gpu") == ()
    # the running kernel's install is as without pre-staging: installed, the old one active
    assert NEW in packages.installed_versions(host, KERNEL, "gpu")
    assert packages.active_version(host, KERNEL, "gpu") == OLD

    # the node reboots into NEXT: depmod indexed it, and its driver loads at boot
    boot(host, NEXT)
    assert modules.module_version(host, "nvidia") == NEW


async def test_a_package_that_fails_its_check_for_another_kernel_is_reported_not_fatal(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    kernel_installed(host, NEXT)
    with_next_kernel(source, lying=True)
    answer = await harness.send(
        dm.InstallDriver(component=GPU, version=NEW, source=source_of(source))
    )
    assert isinstance(answer, dm.DriverInstalled), answer
    assert answer.prestaged_kernels == ()
    assert answer.kernels_without_package == (NEXT,)
    assert packages.installed_versions(host, NEXT, "gpu") == ()
    assert NEW in packages.installed_versions(host, KERNEL, "gpu")


async def test_a_host_with_one_kernel_prestages_nothing(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    answer = await harness.send(
        dm.InstallDriver(component=GPU, version=NEW, source=source_of(source))
    )
    assert isinstance(answer, dm.DriverInstalled), answer
    assert (answer.prestaged_kernels, answer.kernels_without_package) == ((), ())


async def test_a_rollback_gives_each_prestaged_kernel_its_version_from_before_again(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    old_driver_on(host, NEXT)
    kernel_installed(host, LATER)
    with_next_kernel(source, also=(LATER,))
    rolled = await upgrade_and_roll_back(harness, source)

    assert isinstance(rolled, dm.DriverRolledBack), rolled
    assert rolled.restored_kernels == (NEXT, LATER)
    assert rolled.kernels_not_restored == ()
    assert packages.active_version(host, NEXT, "gpu") == OLD
    assert packages.installed_versions(host, NEXT, "gpu") == (OLD,)
    # the kernel that had no driver has none again: neither the files nor an active version
    assert packages.installed_versions(host, LATER, "gpu") == ()
    assert packages.active_version(host, LATER, "gpu") is None
    assert harness.store.load().component("gpu").prestaged == {}

    # depmod indexed both again: a reboot into NEXT boots OLD, into LATER no driver
    boot(host, NEXT)
    assert modules.module_version(host, "nvidia") == OLD
    boot(host, LATER)
    assert modules.module_version(host, "nvidia") is None


async def test_a_prestaged_kernel_whose_earlier_version_is_gone_is_reported_not_fatal(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    old_driver_on(host, NEXT)
    kernel_installed(host, LATER)
    with_next_kernel(source, also=(LATER,))
    for command in (
        dm.UnloadDriver(component=GPU),
        install(source),
        dm.LoadDriver(component=GPU, version=NEW),
    ):
        answer = await harness.send(command)
        assert not isinstance(answer, dm.DriverFailure), answer
    shutil.rmtree(packages.package_dir(host, NEXT, "gpu", OLD))  # someone cleaned up

    rolled = await harness.send(dm.RollbackDriver(component=GPU, version=OLD))
    assert isinstance(rolled, dm.DriverRolledBack), rolled
    assert modules.module_version(host, "nvidia") == OLD  # the running kernel's rollback stands
    assert rolled.kernels_not_restored == (NEXT,)
    assert rolled.restored_kernels == (LATER,)
    # the version rolled back from is taken off NEXT all the same
    assert packages.installed_versions(host, NEXT, "gpu") == ()
    assert packages.active_version(host, NEXT, "gpu") is None


async def test_a_repeated_install_keeps_the_version_active_before_the_first(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    old_driver_on(host, NEXT)
    with_next_kernel(source)
    for _ in range(2):  # the orchestrator's retry has a command id of its own
        answer = await harness.send(install(source))
        assert isinstance(answer, dm.DriverInstalled) and answer.prestaged_kernels == (NEXT,)
    recorded = harness.store.load().component("gpu").prestaged
    assert recorded == {NEXT: PrestagedKernel(version=NEW, prior=OLD)}

    rolled = await harness.send(dm.RollbackDriver(component=GPU, version=OLD))
    assert isinstance(rolled, dm.DriverRolledBack), rolled
    assert rolled.restored_kernels == (NEXT,)
    assert packages.active_version(host, NEXT, "gpu") == OLD


async def test_a_rollback_leaves_a_kernel_changed_since_prestaging_alone(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    old_driver_on(host, NEXT)
    with_next_kernel(source)
    assert isinstance(await harness.send(install(source)), dm.DriverInstalled)
    packages.select_version(host, NEXT, "gpu", OLD)  # an operator chose meanwhile

    rolled = await harness.send(dm.RollbackDriver(component=GPU, version=OLD))
    assert isinstance(rolled, dm.DriverRolledBack), rolled
    assert (rolled.restored_kernels, rolled.kernels_not_restored) == ((), ())
    assert packages.installed_versions(host, NEXT, "gpu") == (OLD, NEW)
    assert harness.store.load().component("gpu").prestaged == {}


async def test_a_failed_rollback_keeps_the_record_and_its_retry_restores_the_kernels(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    old_driver_on(host, NEXT)
    with_next_kernel(source)
    for command in (
        dm.UnloadDriver(component=GPU),
        install(source),
        dm.LoadDriver(component=GPU, version=NEW),
    ):
        answer = await harness.send(command)
        assert not isinstance(answer, dm.DriverFailure), answer
    shutil.rmtree(packages.package_dir(host, KERNEL, "gpu", OLD))

    failed = await harness.send(dm.RollbackDriver(component=GPU, version=OLD))
    assert isinstance(failed, dm.DriverRollbackFailed), failed
    assert packages.active_version(host, NEXT, "gpu") == NEW  # nothing undone yet
    assert NEXT in harness.store.load().component("gpu").prestaged

    retried = await harness.send(
        dm.RollbackDriver(component=GPU, version=OLD, source=source_of(source))
    )
    assert isinstance(retried, dm.DriverRolledBack), retried
    assert retried.restored_kernels == (NEXT,)
    assert packages.active_version(host, NEXT, "gpu") == OLD
