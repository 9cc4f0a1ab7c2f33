"""The real `SubprocessKernelOps` path, end to end: stand-in `modprobe`, `rmmod` and
`depmod` on PATH act on a seeded host root and fail with kmod's own messages, which must
come back as typed errors."""

from __future__ import annotations

import os
import tarfile
import time
from pathlib import Path

import pytest

from gpuop.host import errors, modules, nvidia, packages, packaging, parameters
from gpuop.host.roots import HostRoot
from gpuop.host.subprocesses import SubprocessKernelOps
from gpuop_sim.host import standins
from gpuop_sim.host.simkernel import SimKernel

KERNEL = "6.18.44-fc-v657-gpu"


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = standins.install_tools(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


@pytest.fixture
def ops(seeded: HostRoot, tools: Path) -> SubprocessKernelOps:
    return SubprocessKernelOps(seeded, chroot=False, timeout=20)


def names(root: HostRoot) -> list[str]:
    return [module.name for module in modules.loaded_modules(root)]


async def test_unload_and_load_through_the_tools(ops: SubprocessKernelOps) -> None:
    await ops.unload("nvidia_uvm")
    await ops.unload("nvidia")
    assert await ops.loaded() == ()
    await ops.unload("nvidia")  # not loaded: already done
    await ops.load("nvidia_uvm")
    assert [module.name for module in await ops.loaded()] == ["nvidia_uvm", "nvidia"]


async def test_an_in_use_failure_names_the_dependent_modules(ops: SubprocessKernelOps) -> None:
    await ops.load("nvidia_drm")
    with pytest.raises(errors.ModuleInUse) as raised:
        await ops.unload("nvidia")
    assert raised.value.module == "nvidia"
    assert set(raised.value.holders) == {"nvidia_drm", "nvidia_modeset", "nvidia_uvm"}


async def test_an_open_handle_keeps_the_driver_in_use(
    ops: SubprocessKernelOps, seeded: HostRoot
) -> None:
    await ops.unload("nvidia_uvm")
    SimKernel(seeded).hold("nvidia", "telemetry:1")
    with pytest.raises(errors.ModuleInUse) as raised:
        await ops.unload("nvidia")
    assert (raised.value.module, raised.value.holders) == ("nvidia", ())
    SimKernel(seeded).release("nvidia", "telemetry:1")
    await ops.unload("nvidia")


async def test_a_missing_module_and_a_refused_module(
    ops: SubprocessKernelOps, seeded: HostRoot
) -> None:
    with pytest.raises(errors.ModuleNotFound) as raised:
        await ops.load("nouveau")
    assert (raised.value.module, raised.value.kernel_release) == ("nouveau", KERNEL)
    path = packages.package_dir(seeded, KERNEL, "gpu", "580.159.04") / "nvidia_peermem.ko"
    path.write_bytes(b"\x7fELF")
    with pytest.raises(errors.ModuleLoadFailed) as refused:
        await ops.load("nvidia_peermem")
    assert (refused.value.module, refused.value.message) == ("nvidia_peermem", "Exec format error")
    with pytest.raises(errors.ModuleUnloadFailed, match="mlx5_core is builtin"):
        await ops.unload("mlx5_core")


async def test_install_an_archive_depmod_and_reload_a_new_version(
    ops: SubprocessKernelOps, seeded: HostRoot, tmp_path: Path
) -> None:
    built = packaging.build_package(tmp_path / "source", "gpu", "590.44.01", KERNEL)
    target = packages.package_dir(seeded, KERNEL, "gpu", "590.44.01")
    with tarfile.open(built.path) as archive:
        archive.extractall(target, filter="data")
    packages.select_version(seeded, KERNEL, "gpu", "590.44.01")
    await ops.depmod(KERNEL)
    for module in ("nvidia_uvm", "nvidia"):
        await ops.unload(module)
    await ops.load("nvidia_uvm")
    driver = nvidia.driver_version(seeded)
    assert driver is not None and driver.version == "590.44.01"
    assert modules.module_version(seeded, "nvidia_uvm") == "590.44.01"


async def test_depmod_of_a_kernel_with_no_modules_fails(ops: SubprocessKernelOps) -> None:
    with pytest.raises(errors.DepmodFailed, match="could not open directory"):
        await ops.depmod("5.4.0-1-generic")


async def test_a_tool_that_is_not_installed(
    seeded: HostRoot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    ops = SubprocessKernelOps(seeded, chroot=False)
    with pytest.raises(errors.KernelToolMissing) as raised:
        await ops.load("nvidia")
    assert raised.value.tool == "modprobe"
    with pytest.raises(errors.KernelToolMissing):
        await ops.depmod(KERNEL)


async def test_under_chroot_a_host_without_kmod_reports_the_tool_missing(
    seeded: HostRoot,
) -> None:
    if os.geteuid() != 0:
        pytest.fail("chroot needs root: run the tests as root (CI does)")
    with pytest.raises(errors.KernelToolMissing) as raised:
        await SubprocessKernelOps(seeded, chroot=True, timeout=10).unload("nvidia_uvm")
    assert raised.value.tool == "rmmod"


async def test_a_tool_that_hangs_is_killed_at_the_timeout(
    seeded: HostRoot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "slow-bin"
    bin_dir.mkdir()
    marker = tmp_path / "still-running"
    script = bin_dir / "modprobe"
    script.write_text(f"#!/bin/sh\nsleep 30\ntouch {marker}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    started = time.monotonic()
    with pytest.raises(errors.KernelToolTimedOut) as raised:
        await SubprocessKernelOps(seeded, chroot=False, timeout=0.3).load("nvidia")
    assert time.monotonic() - started < 5
    assert raised.value.command == ("modprobe", "nvidia")
    assert not marker.exists()


def test_the_tools_print_kmods_messages(
    seeded: HostRoot, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUOP_HOST_ROOT", str(seeded.path))
    assert standins.run_tool("rmmod", ["nvidia"]) == 1
    assert standins.run_tool("modprobe", ["-r", "nvidia"]) == 1
    assert standins.run_tool("modprobe", ["nouveau"]) == 1
    assert standins.run_tool("rmmod", ["nvidia_drm"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "rmmod: ERROR: Module nvidia is in use by: nvidia_uvm",
        "modprobe: FATAL: Module nvidia is in use.",
        f"modprobe: FATAL: Module nouveau not found in directory /lib/modules/{KERNEL}",
        "rmmod: ERROR: Module nvidia_drm is not currently loaded",
    ]
    monkeypatch.delenv("GPUOP_HOST_ROOT")
    assert standins.run_tool("depmod", ["-a"]) == 1
    assert "GPUOP_HOST_ROOT is not set" in capsys.readouterr().err


async def test_module_parameters_reach_the_kernel_as_modprobe_words(
    ops: SubprocessKernelOps, seeded: HostRoot
) -> None:
    await ops.unload("nvidia_uvm")
    await ops.unload("nvidia")
    await ops.load("nvidia", {"NVreg_EnableGpuFirmware": "0", "NVreg_RegistryDwords": "A=1;B=2"})
    assert parameters.shown(seeded, "nvidia") == {
        "NVreg_EnableGpuFirmware": "0",
        "NVreg_RegistryDwords": "A=1;B=2",
    }
    await ops.unload("nvidia")
    with pytest.raises(errors.ModuleLoadFailed) as refused:
        await ops.load("nvidia", {"NVreg_EnableGpuFirmware": "off"})
    assert "Invalid argument" in str(refused.value)
