"""Format 2 packages install for real into a host root: modules where depmod (Debian kmod's,
`depmod -b`) indexes them, user space in a versioned prefix switched by one link, firmware
where the module looks for it; and a package the kernel would not take, or that was changed,
is refused before anything is placed. Modules here are tiny ELF files with a `.modinfo`
section (`tests.support.kernel_modules`): what modinfo and depmod read of a real `.ko`."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from gpuop.clocks import VirtualClock
from gpuop.events.driver import InstallFailureReason
from gpuop.host import kmod, packages, packaging
from gpuop.host.errors import KernelToolMissing
from gpuop.host.manifests import Flavour, Role
from gpuop.host.roots import HostRoot
from gpuop.services.driver_manager import installing, reloading
from gpuop.services.driver_manager.config import DriverManagerConfig
from gpuop_sim.host import keys, seeding
from tests.support.driver_manager import TRUSTED, recorded_host, source_of
from tests.support.kernel_modules import module_elf

KERNEL = "6.1.0-57-amd64"
VERSION = "535.261.03"
V1_VERSION = "580.159.04"


@pytest.fixture(autouse=True)
def kmod_installed() -> None:
    for tool in ("modinfo", "depmod"):
        try:
            kmod.tool(tool)
        except KernelToolMissing:
            pytest.fail(f"{tool} is not installed: apt-get install kmod")


def host(tmp_path: Path, kernel: str = KERNEL) -> HostRoot:
    return seeding.seed_host_root(
        tmp_path / "host", recorded_host(), gpu_version=None, kernel_release=kernel
    )


def package_files(
    kernel: str = KERNEL, *, signed: bool = False
) -> dict[str, packaging.PackageContent]:
    vermagic = f"{kernel} SMP preempt mod_unload modversions "
    return {
        "modules/nvidia.ko": packaging.PackageContent(
            module_elf("nvidia", vermagic, version=VERSION, signed=signed), Role.MODULE
        ),
        "modules/nvidia-uvm.ko": packaging.PackageContent(
            module_elf("nvidia_uvm", vermagic, depends="nvidia", signed=signed), Role.MODULE
        ),
        f"userspace/lib/libnvidia-ml.so.{VERSION}": packaging.PackageContent(
            b"\x7fELF nvml", Role.LIBRARY
        ),
        "userspace/bin/nvidia-smi": packaging.PackageContent(b"#!smi", Role.BINARY, 0o755),
        "firmware/gsp_ga10x.bin": packaging.PackageContent(b"gsp", Role.FIRMWARE),
    }


def build(
    source: Path,
    *,
    kernel: str = KERNEL,
    files: dict[str, packaging.PackageContent] | None = None,
    version: str = VERSION,
) -> packaging.BuiltPackage:
    built = packaging.write_package_v2(
        source,
        component="gpu",
        version=version,
        flavour=Flavour.OPEN,
        kernel_release=kernel,
        files=files if files is not None else package_files(kernel),
        links={"userspace/lib/libnvidia-ml.so.1": f"libnvidia-ml.so.{VERSION}"},
    )
    packaging.add_to_index(source, built, keys.SIGNING_KEY)
    return built


def installer(root: HostRoot) -> installing.Installer:
    return installing.Installer(
        root, kmod.HostRootKernel(root), DriverManagerConfig(trust=TRUSTED), VirtualClock()
    )


async def test_a_v2_package_installs_modules_user_space_and_firmware(tmp_path: Path) -> None:
    root = host(tmp_path)
    built = build(tmp_path / "source")
    done = await installer(root).install("gpu", VERSION, source_of(tmp_path / "source"))
    assert (done.version, done.sha256, done.fresh) == (VERSION, built.sha256, True)
    version_dir = packages.package_dir(root, KERNEL, "gpu", VERSION)
    assert sorted(p.name for p in (version_dir / "modules").iterdir()) == [
        "nvidia-uvm.ko",
        "nvidia.ko",
    ]
    dep = root.join(f"lib/modules/{KERNEL}/modules.dep").read_text()
    prefix = f"updates/gpuop/gpu/{VERSION}/modules"
    assert f"{prefix}/nvidia.ko:\n" in dep
    assert f"{prefix}/nvidia-uvm.ko:" in dep
    userspace = installing.userspace_dir(root, "gpu", VERSION)
    assert os.readlink(userspace / "lib/libnvidia-ml.so.1") == f"libnvidia-ml.so.{VERSION}"
    assert (userspace / "bin/nvidia-smi").stat().st_mode & 0o777 == 0o755
    assert root.join(f"lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin").read_bytes() == b"gsp"
    assert installing.active_userspace(root, "gpu") is None


async def test_user_space_switches_by_one_link_and_flips_back(tmp_path: Path) -> None:
    root = host(tmp_path)
    build(tmp_path / "source")
    build(tmp_path / "source", version="535.309.01")
    for version in (VERSION, "535.309.01"):
        await installer(root).install("gpu", version, source_of(tmp_path / "source"))
    assert installing.activate_userspace(root, "gpu", VERSION) is None
    assert installing.activate_userspace(root, "gpu", "535.309.01") == VERSION
    current = installing.userspace_dir(root, "gpu") / installing.CURRENT
    assert current.resolve() == installing.userspace_dir(root, "gpu", "535.309.01")
    assert installing.activate_userspace(root, "gpu", VERSION) == "535.309.01"  # rollback
    assert installing.active_userspace(root, "gpu") == VERSION
    with pytest.raises(installing.InstallError, match="has no user space installed"):
        installing.activate_userspace(root, "gpu", "999.1")


async def refused(root: HostRoot, source: Path) -> installing.InstallError:
    with pytest.raises(installing.InstallError) as error:
        await installer(root).install("gpu", VERSION, source_of(source))
    assert not packages.package_dir(root, KERNEL, "gpu", VERSION).exists()
    assert not installing.userspace_dir(root, "gpu", VERSION).exists()
    return error.value


async def test_a_package_built_for_another_kernel_is_refused_by_its_vermagic(
    tmp_path: Path,
) -> None:
    root = host(tmp_path)
    build(tmp_path / "source", files=package_files("6.1.0-56-amd64"))
    error = await refused(root, tmp_path / "source")
    assert error.reason is InstallFailureReason.KERNEL_MISMATCH
    assert "built for kernel 6.1.0-56-amd64, the node runs 6.1.0-57-amd64" in error.message


@pytest.mark.parametrize(
    ("path", "content"),
    [
        ("sys/kernel/security/lockdown", b"none [integrity] confidentiality\n"),
        (kmod.SECURE_BOOT, b"\x06\x00\x00\x00\x01"),
    ],
)
async def test_an_unsigned_module_is_refused_under_lockdown_or_secure_boot(
    tmp_path: Path, path: str, content: bytes
) -> None:
    root = host(tmp_path)
    root.join(path).parent.mkdir(parents=True, exist_ok=True)
    root.join(path).write_bytes(content)
    build(tmp_path / "source")
    error = await refused(root, tmp_path / "source")
    assert error.reason is InstallFailureReason.UNSIGNED_MODULE
    assert "nvidia" in error.message and "is not signed" in error.message
    # signed modules install
    build(tmp_path / "source", files=package_files(signed=True))
    await installer(root).install("gpu", VERSION, source_of(tmp_path / "source"))


def test_no_lockdown_and_secure_boot_off_need_no_signatures(tmp_path: Path) -> None:
    root = host(tmp_path)
    root.join("sys/kernel/security").mkdir(parents=True, exist_ok=True)
    root.join("sys/kernel/security/lockdown").write_text("[none] integrity confidentiality\n")
    root.join(kmod.SECURE_BOOT).parent.mkdir(parents=True, exist_ok=True)
    root.join(kmod.SECURE_BOOT).write_bytes(b"\x06\x00\x00\x00\x00")
    assert kmod.signatures_required(root) is None


def rewrite_archive(archive: Path, change: dict[str, tuple[bytes, int]]) -> None:
    """The archive with members replaced (content, mode), its manifest left as it was."""
    with tarfile.open(archive) as tar:
        members = [(m, tar.extractfile(m)) for m in tar.getmembers()]
        contents = {m.name: (m, f.read() if f else b"") for m, f in members}
    raw = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w") as tar,
    ):
        for name, (member, data) in contents.items():
            data, mode = change.get(name, (data, member.mode))
            member.size, member.mode = len(data), mode
            tar.addfile(member, io.BytesIO(data))
    archive.write_bytes(raw.getvalue())


def republish(source: Path, built: packaging.BuiltPackage) -> None:
    """The index lists the changed archive's digest and is signed again (a publisher's own
    mistake, or a tamperer with the key): the manifest's digests still catch it."""
    packaging.add_to_index(
        source,
        packaging.BuiltPackage(
            built.component,
            built.version,
            built.kernel_release,
            built.path,
            packaging.sha256_of(built.path),
            built.flavour,
        ),
        keys.SIGNING_KEY,
    )


async def test_a_file_changed_after_the_build_is_refused_by_its_sha256(tmp_path: Path) -> None:
    root = host(tmp_path)
    built = build(tmp_path / "source")
    rewrite_archive(built.path, {"userspace/bin/nvidia-smi": (b"#!evil", 0o755)})
    republish(tmp_path / "source", built)
    error = await refused(root, tmp_path / "source")
    assert error.reason is InstallFailureReason.VERIFICATION_FAILED
    assert "userspace/bin/nvidia-smi has sha256" in error.message
    assert "changed after the package was built" in error.message


async def test_a_file_whose_mode_differs_from_the_manifest_is_refused(tmp_path: Path) -> None:
    root = host(tmp_path)
    built = build(tmp_path / "source")
    rewrite_archive(built.path, {"userspace/bin/nvidia-smi": (b"#!smi", 0o644)})
    republish(tmp_path / "source", built)
    error = await refused(root, tmp_path / "source")
    assert error.reason is InstallFailureReason.VERIFICATION_FAILED
    assert "userspace/bin/nvidia-smi has mode 0644, its manifest says 0755" in error.message


async def test_setuid_bits_in_the_archive_never_reach_the_host(tmp_path: Path) -> None:
    root = host(tmp_path)
    built = build(tmp_path / "source")
    rewrite_archive(built.path, {"userspace/bin/nvidia-smi": (b"#!smi", 0o4755)})
    republish(tmp_path / "source", built)
    await installer(root).install("gpu", VERSION, source_of(tmp_path / "source"))
    smi = installing.userspace_dir(root, "gpu", VERSION) / "bin/nvidia-smi"
    assert smi.stat().st_mode & 0o7777 == 0o755


async def test_a_malformed_manifest_is_refused_naming_the_field(tmp_path: Path) -> None:
    root = host(tmp_path)
    built = build(tmp_path / "source")
    with tarfile.open(built.path) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        manifest = json.loads(member.read())
    manifest["flavour"] = "closed"
    rewrite_archive(built.path, {"manifest.json": (json.dumps(manifest).encode(), 0o644)})
    republish(tmp_path / "source", built)
    error = await refused(root, tmp_path / "source")
    assert error.reason is InstallFailureReason.OTHER
    assert "manifest.json: flavour" in error.message


async def test_v1_and_v2_packages_install_from_one_source(tmp_path: Path) -> None:
    root = host(tmp_path)
    source = tmp_path / "source"
    packaging.build_driver_source(source, [("gpu", V1_VERSION, KERNEL)])
    build(source)
    index = json.loads((source / "index.json").read_text())["packages"]
    assert {e.get("flavour") for e in index} == {None, "open"}
    # format 1 stand-ins are no ELF: the simulated kernel indexes them, not depmod
    done = await installing.Installer(
        root, _IndexOnly(), DriverManagerConfig(trust=TRUSTED), VirtualClock()
    ).install("gpu", V1_VERSION, source_of(source))
    assert done.fresh
    assert (packages.package_dir(root, KERNEL, "gpu", V1_VERSION) / "nvidia.ko").is_file()
    shutil.rmtree(packages.package_dir(root, KERNEL, "gpu", V1_VERSION))
    done = await installer(root).install("gpu", VERSION, source_of(source))
    assert done.fresh
    assert done.sha256 == next(e["sha256"] for e in index if e.get("flavour") == "open")


class _IndexOnly(kmod.HostRootKernel):
    def __init__(self) -> None:
        pass

    async def depmod(self, kernel_release: str) -> None:
        return None


async def test_the_load_switches_user_space_with_the_modules_and_puts_it_back_on_failure(
    tmp_path: Path,
) -> None:
    root = host(tmp_path)
    build(tmp_path / "source")
    await installer(root).install("gpu", VERSION, source_of(tmp_path / "source"))
    reloader = reloading.Reloader(root, kmod.HostRootKernel(root), VirtualClock(), 0.1)
    # the modules cannot load into a host root that is not running: the link goes back
    with pytest.raises(reloading.LoadError):
        await reloader.load("gpu", VERSION, ("nvidia",))
    assert installing.active_userspace(root, "gpu") is None
    # selected with its modules; a format 1 version (no user space) leaves none in use
    assert installing.select_userspace(root, "gpu", VERSION) is None
    assert installing.active_userspace(root, "gpu") == VERSION
    assert installing.select_userspace(root, "gpu", V1_VERSION) == VERSION
    assert installing.active_userspace(root, "gpu") is None
    installing.restore_userspace(root, "gpu", VERSION)
    assert installing.active_userspace(root, "gpu") == VERSION


def test_modinfo_is_the_hosts_own_when_the_host_root_has_one(tmp_path: Path) -> None:
    root = HostRoot(tmp_path / "host")
    module = root.join("lib/modules/k/updates/gpuop/gpu/1/modules/nvidia.ko")
    module.parent.mkdir(parents=True)
    module.write_bytes(b"")
    assert kmod.modinfo_command(module, root)[0] != "chroot"  # the host has none: ours
    root.join("usr/sbin").mkdir(parents=True)
    root.join("usr/sbin/modinfo").write_bytes(b"")
    assert kmod.modinfo_command(module, root) == [
        "chroot",
        str(root.path.resolve()),
        "/usr/sbin/modinfo",
        "/lib/modules/k/updates/gpuop/gpu/1/modules/nvidia.ko",
    ]
    assert kmod.modinfo_command(tmp_path / "elsewhere.ko", root)[0] != "chroot"
    assert kmod.modinfo_command(module, HostRoot(Path("/")))[0] != "chroot"
