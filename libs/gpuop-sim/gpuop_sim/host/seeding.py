"""A simulated node's host root, seeded from the recorded H200 host.

Tests and the demo call `seed_host_root` to get a writable copy of the recorded H200 host
root (`gpuop_sim.recordings`) whose simulated kernel runs what the real one did: the GPU
driver package installed for the recorded kernel (`6.18.44-fc-v657-gpu`) and `nvidia` and
`nvidia_uvm` loaded from it at 580.159.04, with a fresh boot id. The recorded host had
`mlx5_core`, `mlx5_ib` and `ib_core` built into its kernel; `ofed_version` replaces them with
loadable modules of an installed OFED package, so OFED upgrades can be simulated too.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gpuop.host import components, modules, packages, system
from gpuop.host.files import write_atomic
from gpuop.host.roots import HostRoot
from gpuop_sim.host import mpscontrol
from gpuop_sim.host.simkernel import SimKernel

RECORDED_DRIVER_VERSION = "580.159.04"
"""The NVIDIA driver the recorded host ran."""


def seed_host_root(
    destination: Path,
    recorded: Path,
    *,
    gpu_version: str | None = RECORDED_DRIVER_VERSION,
    ofed_version: str | None = None,
    boot_id: str | None = None,
    kernel_release: str | None = None,
) -> HostRoot:
    """Copy the host root `recorded` into `destination` and boot a simulated kernel on it:
    `gpu_version` (None: no GPU driver) installed and `nvidia`, `nvidia_uvm` loaded, with
    the driver's `nvidia-cuda-mps-control` (the stand-in of `mpscontrol`);
    `ofed_version`, when given, installed and `mlx5_core`, `ib_core`, `mlx5_ib` loaded;
    `kernel_release`, when given, the release the host runs instead of the recording's (a
    node on another kernel build needs its own driver packages). The recorded files are
    only read."""
    _copy_writable(recorded, destination)
    root = HostRoot(destination)
    if kernel_release is not None:
        _run_kernel_release(root, kernel_release)
    kernel = SimKernel(root)
    kernel_release = kernel.kernel_release()
    kernel.reboot(boot_id=boot_id)
    packages.modules_dir(root, kernel_release).mkdir(parents=True, exist_ok=True)
    to_load: list[str] = []
    if gpu_version is not None:
        _install(root, components.GPU, gpu_version, kernel_release)
        mpscontrol.install(root.path)  # the driver's user-space tools bring it
        to_load += ["nvidia", "nvidia_uvm"]
    if ofed_version is not None:
        for module in components.modules_of(components.OFED):
            info = modules.module_info(root, module)
            if info is not None and info.builtin:
                shutil.rmtree(root.join(f"{modules.SYS_MODULE}/{module}"))
        _install(root, components.OFED, ofed_version, kernel_release)
        to_load += list(components.modules_of(components.OFED))
    kernel.run_depmod(kernel_release)
    for module in to_load:
        kernel.modprobe(module)
    return root


def _run_kernel_release(root: HostRoot, release: str) -> None:
    """Make `release` the running kernel's: `osrelease`, and the release in `proc/version`."""
    recorded = system.kernel_release(root)
    write_atomic(root.join(system.OSRELEASE), f"{release}\n")
    version = root.read_text(system.PROC_VERSION)
    if version is not None and recorded:
        write_atomic(root.join(system.PROC_VERSION), version.replace(recorded, release, 1))


def _install(root: HostRoot, component: str, version: str, kernel_release: str) -> None:
    packages.install_standins(root, component, version, kernel_release)
    packages.select_version(root, kernel_release, component, version)


def _copy_writable(source: Path, destination: Path) -> None:
    # the recording is read-only (sysfs modes); the copy must be writable for the simulation
    shutil.copytree(
        source, destination, symlinks=True, copy_function=shutil.copyfile, dirs_exist_ok=True
    )
    for directory, _, files in os.walk(destination):
        os.chmod(directory, 0o755)
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, 0o644)
