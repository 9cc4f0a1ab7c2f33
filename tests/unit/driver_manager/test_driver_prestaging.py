"""An install pre-stages the version for every other kernel of the host (the one a pending
reboot boots), so a rebooted node comes up with its driver; a kernel the source has no
package for, or whose package fails a check, is reported in `DriverInstalled`, never fatal."""

from __future__ import annotations

import json
from pathlib import Path

from gpuop.events import driver as dm
from gpuop.host import modules, packages, packaging
from gpuop.host.roots import HostRoot
from gpuop_sim.host import keys
from gpuop_sim.host.simkernel import SimKernel
from tests.support.driver_manager import KERNEL, NEW, OLD, Harness, source_of

GPU = dm.Component.GPU
NEXT = "6.18.50-fc-v660-gpu"
"""A newer kernel installed on the host, booted at the next reboot."""
BARE = "6.18.49-fc-v659-gpu"
"""Another one the source has no package for."""


def install(source: Path) -> dm.InstallDriver:
    return dm.InstallDriver(component=GPU, version=NEW, source=source_of(source))


def kernel_installed(root: HostRoot, release: str) -> None:
    (root.join(f"lib/modules/{release}") / "kernel").mkdir(parents=True)


def with_next_kernel(source: Path, *, lying: bool = False) -> None:
    """The test source plus NEW built for NEXT; `lying`: the index lists for NEXT the
    archive built for the running kernel (its manifest names that kernel)."""
    built = packaging.build_package(source, "gpu", NEW, NEXT)
    index = json.loads((source / packaging.INDEX).read_text())
    entry = built.index_entry()
    if lying:
        running = source / packaging.archive_name("gpu", NEW, KERNEL)
        entry |= {"file": running.name, "sha256": packaging.sha256_of(running)}
    index["packages"].append(entry)
    (source / packaging.INDEX).write_text(json.dumps(index))
    packaging.sign_driver_source(source, keys.SIGNING_KEY)


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
    host.join("proc/sys/kernel/osrelease").write_text(NEXT + "\n")
    SimKernel(host).reboot(load=("nvidia",))
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
