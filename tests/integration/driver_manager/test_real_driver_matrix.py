"""Every (branch, flavour, architecture) package gpuop builds from Debian, for bookworm's
newest kernel of each architecture: `make test-driver-matrix`, not CI (each cold build takes
minutes; CI's slow suite builds the three that `test_real_driver_packages.py` and
`test_real_driver_branches.py` use). Each package is built (or found in the cache,
`tests.support.driver_packages`) and its modules are checked as a node's kernel would:
ELF machine of the architecture, vermagic naming the kernel, the driver's version."""

from __future__ import annotations

import tarfile
import time
from pathlib import Path

import pytest

from gpuop.host import branches, kmod
from gpuop.host.manifests import Flavour
from tests.support import driver_packages

pytestmark = [pytest.mark.slow, pytest.mark.driver_matrix, pytest.mark.timeout(3600)]

VERSIONS = {"535": driver_packages.VERSION, "550": driver_packages.VERSION_550}
ELF_MACHINES = {"amd64": "Advanced Micro Devices X86-64", "arm64": "AArch64"}


def test_every_branch_the_builder_knows_is_in_the_matrix() -> None:
    assert set(VERSIONS) == set(branches.BRANCHES)
    assert set(ELF_MACHINES) == set(branches.ARCHES)


@pytest.mark.parametrize("arch", sorted(branches.ARCHES))
@pytest.mark.parametrize("flavour", list(Flavour))
@pytest.mark.parametrize("branch", sorted(VERSIONS))
def test_the_package_holds_modules_a_kernel_of_its_architecture_takes(
    tmp_path: Path, branch: str, flavour: Flavour, arch: str
) -> None:
    version = VERSIONS[branch]
    kernel = driver_packages.newest_kernel(arch)
    start = time.monotonic()
    cached = driver_packages.cached_package(flavour, kernel, version=version)
    if cached.built_seconds is not None:
        print(f"\n{version} {flavour.value} {arch}: built cold in {time.monotonic() - start:.0f} s")
    with tarfile.open(cached.package.path) as archive:
        archive.extractall(tmp_path, filter="data")
    nvidia = tmp_path / "modules/nvidia.ko"
    assert driver_packages.elf_machine(nvidia) == ELF_MACHINES[arch]
    info = kmod.modinfo(nvidia)
    assert info["vermagic"][0].split()[0] == kernel
    assert info["version"] == [version]
    assert driver_packages.manifest_of(cached.package).flavour is flavour
