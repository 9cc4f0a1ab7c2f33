"""NVIDIA's real driver, end to end as far as a machine without a GPU goes: Debian's
535.261.03 packages built into gpuop packages (both flavours, compiled against Debian's
kernel headers; cached, see `tests.support.driver_packages`), installed into a seeded host
root by the driver-manager's installer, indexed by Debian kmod's own `depmod -b`, which
finds `nvidia_uvm` needing `nvidia` from the modules' real symbols; and the refusals
with real modules: another kernel's vermagic, unsigned modules under lockdown, a changed
file. Then the driver-manager agent's own install, load and validate on the simulated node,
whose kernel loads the real modules from what their `.modinfo` declares."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from gpuop.bus import InMemoryBus
from gpuop.clocks import VirtualClock
from gpuop.events.driver import InstallFailureReason
from gpuop.host import building, kmod, packages, packaging
from gpuop.host.errors import ModuleLoadFailed
from gpuop.host.manifests import Flavour, Role
from gpuop.host.roots import HostRoot
from gpuop.services.driver_manager import installing
from gpuop.services.driver_manager.config import DriverManagerConfig
from gpuop_sim.host import keys, seeding
from gpuop_sim.host.simkernel import SimKernel
from tests.support import driver_packages
from tests.support.driver_manager import TRUSTED, recorded_host, running_agent, source_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]  # a cold build of both flavours

VERSION = driver_packages.VERSION


@pytest.fixture(scope="module")
def kernel() -> str:
    for tool in ("apt-get", "dpkg-deb", "make", "gcc-12", "strip", "modinfo", "depmod"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode:
            pytest.fail(
                f"{tool} is not installed: apt-get install kmod binutils make gcc-12 dpkg "
                "(.ci/run's driver-build-tools stage does)"
            )
    return driver_packages.newest_kernel()


@pytest.fixture(scope="module")
def built(kernel: str) -> dict[Flavour, packaging.BuiltPackage]:
    result = {}
    for flavour in (Flavour.PROPRIETARY, Flavour.OPEN):
        cached = driver_packages.cached_package(flavour, kernel)
        if cached.built_seconds is not None:
            print(f"built the {flavour.value} package cold in {cached.built_seconds:.0f} s")
        result[flavour] = cached.package
    return result


def host(tmp_path: Path, kernel: str) -> HostRoot:
    return seeding.seed_host_root(
        tmp_path / "host", recorded_host(), gpu_version=None, kernel_release=kernel
    )


def installer(root: HostRoot) -> installing.Installer:
    return installing.Installer(
        root, kmod.HostRootKernel(root), DriverManagerConfig(trust=TRUSTED), VirtualClock()
    )


def test_both_flavours_hold_the_modules_user_space_and_firmware(
    built: dict[Flavour, packaging.BuiltPackage], kernel: str
) -> None:
    for flavour, package in built.items():
        manifest = driver_packages.manifest_of(package)
        assert (manifest.flavour, manifest.kernel_release) == (flavour, kernel)
        paths = {f.path: f for f in manifest.files}
        for module in ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm"):
            assert f"modules/{module}.ko" in paths
        for library in ("libnvidia-ml", "libcuda"):
            assert paths[f"userspace/lib/{library}.so.{VERSION}"].role is Role.LIBRARY
        assert paths["userspace/bin/nvidia-smi"].mode == "0755"
        assert paths["userspace/bin/nvidia-persistenced"].role is Role.BINARY
        assert {p for p in paths if p.startswith("firmware/")} >= {
            "firmware/gsp_ga10x.bin",
            "firmware/gsp_tu10x.bin",
        }
        links = {link.path: link.target for link in manifest.links}
        assert links["userspace/lib/libnvidia-ml.so.1"] == f"libnvidia-ml.so.{VERSION}"
        sources = {b.name: b.version for b in manifest.built_from}
        module_source = (
            "nvidia-open-kernel-dkms" if flavour is Flavour.OPEN else "nvidia-kernel-dkms"
        )
        assert sources[module_source].startswith(VERSION)
        assert f"linux-headers-{kernel}" in sources


@pytest.mark.parametrize("flavour", [Flavour.PROPRIETARY, Flavour.OPEN])
async def test_a_real_package_installs_and_depmod_finds_uvm_needing_nvidia(
    tmp_path: Path, built: dict[Flavour, packaging.BuiltPackage], kernel: str, flavour: Flavour
) -> None:
    root = host(tmp_path, kernel)
    source = driver_packages.real_source(tmp_path / "source", [built[flavour]])
    done = await installer(root).install("gpu", VERSION, source_of(source))
    assert done.sha256 == built[flavour].sha256
    modules = packages.package_dir(root, kernel, "gpu", VERSION) / "modules"
    relative = f"updates/gpuop/gpu/{VERSION}/modules"
    dep = {
        line.partition(":")[0]: line.partition(":")[2].split()
        for line in root.join(f"lib/modules/{kernel}/modules.dep").read_text().splitlines()
    }
    assert dep[f"{relative}/nvidia-uvm.ko"] == [f"{relative}/nvidia.ko"]
    assert dep[f"{relative}/nvidia.ko"] == []
    assert f"{relative}/nvidia-modeset.ko" in dep[f"{relative}/nvidia-drm.ko"]
    info = kmod.modinfo(modules / "nvidia.ko")
    assert info["vermagic"][0].split()[0] == kernel
    assert info["version"] == [VERSION]
    userspace = installing.userspace_dir(root, "gpu", VERSION)
    assert os.readlink(userspace / "lib/libcuda.so.1") == f"libcuda.so.{VERSION}"
    assert root.join(f"lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin").stat().st_size > 1 << 20
    installing.activate_userspace(root, "gpu", VERSION)
    assert installing.active_userspace(root, "gpu") == VERSION


def repackaged(
    package: packaging.BuiltPackage, directory: Path, *, kernel: str, sign: bool = False
) -> packaging.BuiltPackage:
    """The same real files in a package that says it is for `kernel`, its modules signed
    with a throwaway key when asked."""
    extracted = directory / "extracted"
    with tarfile.open(package.path) as archive:
        archive.extractall(extracted, filter="data")
    manifest = driver_packages.manifest_of(package)
    if sign:
        signing, sign_file = driver_packages.module_signing(directory / "signing")
        modules = [extracted / f.path for f in manifest.files if f.role is Role.MODULE]
        building.sign_modules(modules, sign_file, signing)
    files = {
        f.path: packaging.PackageContent(extracted / f.path, f.role, f.mode_bits)
        for f in manifest.files
    }
    return packaging.write_package_v2(
        directory / "out",
        component="gpu",
        version=VERSION,
        flavour=manifest.flavour,
        kernel_release=kernel,
        files=files,
        links={link.path: link.target for link in manifest.links},
    )


async def test_real_modules_built_for_another_kernel_are_refused_by_vermagic(
    tmp_path: Path, built: dict[Flavour, packaging.BuiltPackage], kernel: str
) -> None:
    other = "6.1.0-1-amd64"
    package = repackaged(built[Flavour.OPEN], tmp_path, kernel=other)
    root = host(tmp_path, other)
    source = driver_packages.real_source(tmp_path / "source", [package])
    with pytest.raises(installing.InstallError) as refused:
        await installer(root).install("gpu", VERSION, source_of(source))
    assert refused.value.reason is InstallFailureReason.KERNEL_MISMATCH
    assert f"built for kernel {kernel}, the node runs {other}" in refused.value.message
    assert not packages.package_dir(root, other, "gpu", VERSION).exists()


async def test_real_unsigned_modules_are_refused_under_lockdown(
    tmp_path: Path, built: dict[Flavour, packaging.BuiltPackage], kernel: str
) -> None:
    root = host(tmp_path, kernel)
    root.join("sys/kernel/security").mkdir(parents=True, exist_ok=True)
    root.join("sys/kernel/security/lockdown").write_text("none [integrity] confidentiality\n")
    source = driver_packages.real_source(tmp_path / "source", [built[Flavour.PROPRIETARY]])
    with pytest.raises(installing.InstallError) as refused:
        await installer(root).install("gpu", VERSION, source_of(source))
    assert refused.value.reason is InstallFailureReason.UNSIGNED_MODULE
    assert "is not signed and the kernel is in lockdown (integrity" in refused.value.message


async def test_real_modules_signed_with_the_kernels_sign_file_install_under_lockdown(
    tmp_path: Path, built: dict[Flavour, packaging.BuiltPackage], kernel: str
) -> None:
    package = repackaged(built[Flavour.PROPRIETARY], tmp_path, kernel=kernel, sign=True)
    root = host(tmp_path, kernel)
    root.join("sys/kernel/security").mkdir(parents=True, exist_ok=True)
    root.join("sys/kernel/security/lockdown").write_text("none [integrity] confidentiality\n")
    source = driver_packages.real_source(tmp_path / "source", [package])
    await installer(root).install("gpu", VERSION, source_of(source))
    modules = packages.package_dir(root, kernel, "gpu", VERSION) / "modules"
    assert kmod.modinfo(modules / "nvidia.ko")["signer"] == ["gpuop test module signing"]


async def test_a_changed_real_module_is_refused_by_its_sha256(
    tmp_path: Path, built: dict[Flavour, packaging.BuiltPackage], kernel: str
) -> None:
    package = built[Flavour.OPEN]
    out = tmp_path / "source"
    out.mkdir()
    changed = out / package.path.name
    with tarfile.open(package.path) as original, tarfile.open(changed, "w:gz") as copy:
        for member in original.getmembers():
            data = original.extractfile(member)
            content = data.read() if data else b""
            if member.name == "modules/nvidia-uvm.ko":
                content = content[:-1] + bytes([content[-1] ^ 1])
            copy.addfile(member, io.BytesIO(content))
    packaging.add_to_index(
        out,
        packaging.BuiltPackage(
            "gpu", VERSION, kernel, changed, packaging.sha256_of(changed), package.flavour
        ),
        keys.SIGNING_KEY,
    )
    root = host(tmp_path, kernel)
    with pytest.raises(installing.InstallError) as refused:
        await installer(root).install("gpu", VERSION, source_of(out))
    assert refused.value.reason is InstallFailureReason.VERIFICATION_FAILED
    assert "modules/nvidia-uvm.ko has sha256" in refused.value.message


async def test_format_1_and_a_real_format_2_package_in_one_source(
    tmp_path: Path, built: dict[Flavour, packaging.BuiltPackage], kernel: str
) -> None:
    source = tmp_path / "source"
    packaging.build_driver_source(source, [("gpu", "580.159.04", kernel)])
    driver_packages.real_source(source, [built[Flavour.PROPRIETARY]])
    root = host(tmp_path, kernel)
    done = await installer(root).install("gpu", VERSION, source_of(source))
    assert done.fresh
    assert (packages.package_dir(root, kernel, "gpu", VERSION) / "modules/nvidia.ko").is_file()


BASE_KERNEL = ("drm", "drm_kms_helper", "video")
"""What NVIDIA's modules need of the kernel itself (their `depends`): built into the simulated
node's kernel, as on the recorded H200, whose `nvidia` loaded with no `drm` module beside it.
Without them the simulated kernel refuses `nvidia` as a real one would: unknown symbols."""


@pytest.mark.parametrize("flavour", [Flavour.OPEN, Flavour.PROPRIETARY])
async def test_the_agent_installs_loads_and_validates_a_real_package_on_the_simulated_node(
    tmp_path: Path, built: dict[Flavour, packaging.BuiltPackage], kernel: str, flavour: Flavour
) -> None:
    """The whole driver-manager path with NVIDIA's real files: install (depmod), load into the
    simulated kernel, which reads each real module's `.modinfo` (name, version, `depends`,
    vermagic) as a kernel would read its ELF, and validate, user space and NVML included."""
    root = host(tmp_path, kernel)
    for needed in BASE_KERNEL:
        root.join(f"sys/module/{needed}").mkdir(parents=True)
    source = driver_packages.real_source(tmp_path / "source", [built[flavour]])
    async with running_agent(InMemoryBus(), root, source) as agent:
        await agent.install_load_validate(VERSION, flavour)
    assert root.read_text("sys/module/nvidia/version") == f"{VERSION}\n"
    assert root.read_text("sys/module/nvidia_uvm/version") == f"{VERSION}\n"
    assert "nvidia_uvm" in os.listdir(root.join("sys/module/nvidia/holders"))
    assert VERSION in (root.read_text("proc/driver/nvidia/version") or "")
    assert installing.active_userspace(root, "gpu") == VERSION


async def test_the_simulated_kernel_refuses_a_real_module_built_for_another_kernel(
    tmp_path: Path, built: dict[Flavour, packaging.BuiltPackage], kernel: str
) -> None:
    """Past the installer's checks (placed by hand), a real module whose vermagic names another
    kernel does not load: `Exec format error`, as insmod says."""
    root = host(tmp_path, kernel)
    await installer(root).install(
        "gpu",
        VERSION,
        source_of(driver_packages.real_source(tmp_path / "source", [built[Flavour.OPEN]])),
    )
    other = seeding.seed_host_root(
        tmp_path / "other", recorded_host(), gpu_version=None, kernel_release="6.1.0-99-amd64"
    )
    moved = packages.package_dir(other, "6.1.0-99-amd64", "gpu", VERSION)
    moved.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(packages.package_dir(root, kernel, "gpu", VERSION), moved)
    packages.select_version(other, "6.1.0-99-amd64", "gpu", VERSION)
    simulated = SimKernel(other)
    simulated.run_depmod()
    with pytest.raises(ModuleLoadFailed, match="Exec format error"):
        simulated.modprobe("nvidia")
