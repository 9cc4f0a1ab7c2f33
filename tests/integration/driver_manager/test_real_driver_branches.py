"""The second driver branch and the second architecture with NVIDIA's real files: Debian
trixie's 550.163.01 (open) cross-compiled for bookworm's newest arm64 kernel (cached, see
`tests.support.driver_packages`), the one package of either that CI's slow suite builds
(its budget: docs/driver-packages.md, "What CI builds").

The package holds trixie's files, its modules are AArch64 ELF whose vermagic names the arm64
kernel, its libraries the aarch64 ones; on a simulated arm64 node the driver-manager agent
installs, loads (the simulated kernel reads the real modules' `.modinfo`) and validates it,
and the node's CDI spec mounts the libraries into `/usr/lib/aarch64-linux-gnu`.

With `make test-driver-matrix` (marker `driver_matrix`) also 550 for amd64: the agent moves
a node from 535 to 550 as an upgrade does and rolls back to 535, user space switching with
the modules."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from gpuop.bus import InMemoryBus
from gpuop.events import driver as dm
from gpuop.host import cdi, kmod, packages, packaging, system
from gpuop.host.manifests import Flavour, Role
from gpuop.host.roots import HostRoot
from gpuop.services.driver_manager import installing
from gpuop_sim.host import seeding
from tests.support import driver_packages
from tests.support.driver_manager import recorded_host, running_agent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]  # cold builds

OLD, NEW = driver_packages.VERSION, driver_packages.VERSION_550
BASE_KERNEL = ("drm", "drm_kms_helper", "video")
"""What NVIDIA's modules need of the kernel itself, built into the simulated node's kernel."""


@pytest.fixture(scope="module")
def kernel() -> str:
    return driver_packages.newest_kernel("amd64")


@pytest.fixture(scope="module")
def arm_kernel() -> str:
    return driver_packages.newest_kernel("arm64")


@pytest.fixture(scope="module")
def both(kernel: str) -> dict[str, packaging.BuiltPackage]:
    return {
        version: driver_packages.cached_package(Flavour.OPEN, kernel, version=version).package
        for version in (OLD, NEW)
    }


@pytest.fixture(scope="module")
def arm(arm_kernel: str) -> packaging.BuiltPackage:
    return driver_packages.cached_package(Flavour.OPEN, arm_kernel, version=NEW).package


def host(tmp_path: Path, kernel: str, machine: str = "x86_64") -> HostRoot:
    root = seeding.seed_host_root(
        tmp_path / "host", recorded_host(), gpu_version=None, kernel_release=kernel
    )
    arch = root.join(system.ARCH)
    arch.parent.mkdir(parents=True, exist_ok=True)
    arch.write_text(f"{machine}\n")
    return root


def test_the_550_package_holds_trixies_files_built_for_bookworms_arm64_kernel(
    arm: packaging.BuiltPackage, arm_kernel: str
) -> None:
    manifest = driver_packages.manifest_of(arm)
    assert (manifest.version, manifest.kernel_release) == (NEW, arm_kernel)
    sources = {b.name: b.version for b in manifest.built_from}
    assert sources["nvidia-open-kernel-dkms"].startswith(NEW)
    assert sources["libnvidia-ml1"].startswith(NEW)
    assert f"linux-headers-{arm_kernel}" in sources
    paths = {f.path for f in manifest.files}
    assert {f"userspace/lib/libcuda.so.{NEW}", "modules/nvidia.ko"} <= paths


@pytest.mark.driver_matrix
async def test_the_agent_moves_a_node_from_535_to_550_and_rolls_back(
    tmp_path: Path, both: dict[str, packaging.BuiltPackage], kernel: str
) -> None:
    """Install, load and validate 535; then 550 as an upgrade does (unload, install, load,
    validate: the simulated kernel loads the real 550 modules from their `.modinfo`); then a
    rollback to 535, user space switching back with the modules."""
    root = host(tmp_path, kernel)
    for needed in BASE_KERNEL:
        root.join(f"sys/module/{needed}").mkdir(parents=True)
    source = driver_packages.real_source(tmp_path / "source", both.values())
    gpu = dm.Component.GPU
    async with running_agent(InMemoryBus(), root, source) as agent:
        for version in (OLD, NEW):
            if version == NEW:
                unloaded = await agent.send(dm.UnloadDriver(component=gpu), timeout=60)
                assert isinstance(unloaded, dm.DriverUnloaded), unloaded
            await agent.install_load_validate(version, Flavour.OPEN)
            assert root.read_text("sys/module/nvidia/version") == f"{version}\n"
            assert installing.active_userspace(root, "gpu") == version
            modules = packages.package_dir(root, kernel, "gpu", version) / "modules"
            info = kmod.modinfo(modules / "nvidia.ko")
            assert info["version"] == [version] and info["vermagic"][0].split()[0] == kernel
        rolled = await agent.send(dm.RollbackDriver(component=gpu, version=OLD), timeout=120)
        assert isinstance(rolled, dm.DriverRolledBack), rolled
    assert root.read_text("sys/module/nvidia/version") == f"{OLD}\n"
    assert installing.active_userspace(root, "gpu") == OLD


def test_the_arm64_package_holds_aarch64_modules_for_the_arm64_kernel(
    arm: packaging.BuiltPackage, arm_kernel: str, tmp_path: Path
) -> None:
    manifest = driver_packages.manifest_of(arm)
    assert manifest.kernel_release == arm_kernel and arm_kernel.endswith("-arm64")
    with tarfile.open(arm.path) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    unpacked = tmp_path / "unpacked"
    for module in ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm"):
        path = unpacked / f"modules/{module}.ko"
        assert driver_packages.elf_machine(path) == "AArch64"
        vermagic = kmod.modinfo(path)["vermagic"][0].split()
        assert vermagic[0] == arm_kernel and "aarch64" in vermagic
    libraries = [f.path for f in manifest.files if f.role is Role.LIBRARY]
    assert f"userspace/lib/libnvidia-ml.so.{NEW}" in libraries
    library = unpacked / f"userspace/lib/libnvidia-ml.so.{NEW}"
    assert driver_packages.elf_machine(library) == "AArch64"
    sources = {b.name for b in manifest.built_from}
    assert {f"linux-headers-{arm_kernel}", "linux-kbuild-6.1"} <= sources


async def test_an_arm64_node_installs_loads_and_validates_it_and_its_cdi_names_aarch64(
    arm: packaging.BuiltPackage, arm_kernel: str, tmp_path: Path
) -> None:
    root = host(tmp_path, arm_kernel, machine="aarch64")
    for needed in BASE_KERNEL:
        root.join(f"sys/module/{needed}").mkdir(parents=True)
    source = driver_packages.real_source(tmp_path / "source", [arm])
    async with running_agent(InMemoryBus(), root, source) as agent:
        await agent.install_load_validate(NEW, Flavour.OPEN)
    assert root.read_text("sys/module/nvidia/version") == f"{NEW}\n"
    assert installing.active_userspace(root, "gpu") == NEW
    relative = f"updates/gpuop/gpu/{NEW}/modules"
    dep = root.join(f"lib/modules/{arm_kernel}/modules.dep").read_text()
    assert f"{relative}/nvidia-uvm.ko: {relative}/nvidia.ko" in dep
    mounts = {m.container_path for m in cdi.driver_files(root).mounts}
    assert "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1" in mounts
    assert not [m for m in mounts if "x86_64" in m]
