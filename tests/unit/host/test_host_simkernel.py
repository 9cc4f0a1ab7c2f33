"""The simulated kernel: the module graph, use by modules and by holders, packages for the
running kernel, and its state living in the host root for every reader to see."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuop.host import components, errors, modules, nvidia, packages, pci, system
from gpuop.host.roots import HostRoot
from gpuop_sim.host import seeding
from gpuop_sim.host.simkernel import SimKernel

KERNEL = "6.18.44-fc-v657-gpu"
GPU = "0000:00:06.0"


def names(root: HostRoot) -> list[str]:
    return [module.name for module in modules.loaded_modules(root)]


def test_a_seeded_host_runs_the_recorded_driver_with_users_counted(seeded: HostRoot) -> None:
    assert modules.loaded_modules(seeded) == (
        modules.LoadedModule("nvidia_uvm", 1830912, 0, (), "Live", taints="O"),
        modules.LoadedModule("nvidia", 14299136, 1, ("nvidia_uvm",), "Live", taints="O"),
    )
    info = modules.module_info(seeded, "nvidia")
    assert info is not None and (info.version, info.refcount, info.holders) == (
        "580.159.04",
        1,
        ("nvidia_uvm",),
    )
    driver = nvidia.driver_version(seeded)
    assert driver is not None and driver.version == "580.159.04"
    assert pci.pci_function(seeded, GPU).driver == "nvidia"
    assert system.boot_id(seeded) == "8c1f2f5e-0c53-4d57-a0a4-3e3c1b0c9a11"
    assert packages.installed_versions(seeded, KERNEL, "gpu") == ("580.159.04",)


def test_loading_a_module_loads_what_it_needs_first(seeded: HostRoot) -> None:
    SimKernel(seeded).modprobe("nvidia_drm")
    assert names(seeded) == ["nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia"]
    nv = modules.loaded_modules(seeded)[-1]
    assert (nv.refcount, set(nv.used_by)) == (3, {"nvidia_drm", "nvidia_modeset", "nvidia_uvm"})


def test_a_module_is_in_use_while_a_dependent_module_is_loaded(seeded: HostRoot) -> None:
    with pytest.raises(errors.ModuleInUse) as raised:
        SimKernel(seeded).rmmod("nvidia")
    assert raised.value.holders == ("nvidia_uvm",)
    assert "nvidia" in names(seeded)


def test_a_module_is_in_use_while_a_holder_holds_it(seeded: HostRoot) -> None:
    kernel = SimKernel(seeded)
    kernel.rmmod("nvidia_uvm")
    kernel.hold("nvidia", "device-plugin:1")
    kernel.hold("nvidia", "device-plugin:1")  # idempotent
    kernel.hold("nvidia", "telemetry:2")
    assert kernel.holders("nvidia") == ("device-plugin:1", "telemetry:2")
    assert modules.loaded_modules(seeded)[0].refcount == 2
    with pytest.raises(errors.ModuleInUse) as raised:
        kernel.rmmod("nvidia")
    assert raised.value.holders == ("device-plugin:1", "telemetry:2")
    kernel.release("nvidia", "device-plugin:1")
    kernel.release("nvidia", "telemetry:2")
    kernel.release("nvidia", "telemetry:2")  # nothing left to release
    kernel.rmmod("nvidia")
    assert names(seeded) == []


def test_unloading_in_dependency_order_removes_the_driver_from_procfs_and_devices(
    seeded: HostRoot,
) -> None:
    kernel = SimKernel(seeded)
    kernel.modprobe("nvidia_drm")
    for module in components.unload_order(components.modules_of("gpu")):
        if kernel.is_loaded(module):
            kernel.rmmod(module)
    assert names(seeded) == []
    assert nvidia.driver_version(seeded) is None and nvidia.gpus(seeded) == ()
    assert modules.module_info(seeded, "nvidia") is None
    assert pci.pci_function(seeded, GPU).driver is None
    assert "DRIVER=" not in (seeded.read_text(f"{pci.DEVICES}/{GPU}/uevent") or "")


def test_rmmod_of_a_module_that_is_not_loaded_or_built_in(seeded: HostRoot) -> None:
    kernel = SimKernel(seeded)
    with pytest.raises(errors.ModuleNotLoaded):
        kernel.rmmod("nvidia_drm")
    with pytest.raises(errors.ModuleUnloadFailed, match="mlx5_core is builtin"):
        kernel.rmmod("mlx5_core")
    kernel.modprobe("mlx5_core")  # built in: already there
    assert not kernel.is_loaded("mlx5_core")


def test_loading_without_an_installed_package_fails_with_module_not_found(
    seeded: HostRoot,
) -> None:
    kernel = SimKernel(seeded)
    kernel.reboot()
    for component in ("gpu",):
        for version in packages.installed_versions(seeded, KERNEL, component):
            for path in packages.package_dir(seeded, KERNEL, component, version).iterdir():
                path.unlink()
    (packages.component_dir(seeded, KERNEL, "gpu") / "active").unlink()
    kernel.run_depmod()
    with pytest.raises(errors.ModuleNotFound) as raised:
        kernel.modprobe("nvidia")
    assert (raised.value.module, raised.value.kernel_release) == ("nvidia", KERNEL)


def test_a_package_installed_but_not_indexed_is_not_found_until_depmod(seeded: HostRoot) -> None:
    kernel = SimKernel(seeded)
    packages.install_standins(seeded, "ofed", "24.10-1.1.4", KERNEL)
    with pytest.raises(errors.ModuleNotFound):
        kernel.modprobe("mlx5_ib")
    kernel.run_depmod(KERNEL)
    kernel.modprobe("mlx5_ib")  # mlx5_core and ib_core are built in, as recorded
    assert names(seeded)[0] == "mlx5_ib"
    assert modules.module_version(seeded, "mlx5_ib") == "24.10-1.1.4"


def test_a_new_version_becomes_loadable_after_select_and_depmod(seeded: HostRoot) -> None:
    kernel = SimKernel(seeded)
    packages.install_standins(seeded, "gpu", "590.44.01", KERNEL)
    packages.select_version(seeded, KERNEL, "gpu", "590.44.01")
    kernel.run_depmod()
    kernel.modprobe("nvidia_modeset")  # nvidia stays at the loaded 580 until it is reloaded
    assert modules.module_version(seeded, "nvidia") == "580.159.04"
    for module in ("nvidia_modeset", "nvidia_uvm", "nvidia"):
        kernel.rmmod(module)
    kernel.modprobe("nvidia_uvm")
    assert modules.module_version(seeded, "nvidia") == "590.44.01"
    driver = nvidia.driver_version(seeded)
    assert driver is not None and (driver.version, driver.arch) == ("590.44.01", "x86_64")
    (gpu,) = nvidia.gpus(seeded)
    assert (gpu.model, gpu.firmware) == ("NVIDIA H200", "590.44.01")
    assert pci.pci_function(seeded, GPU).driver == "nvidia"


def test_depmod_refuses_an_active_version_that_is_not_installed(seeded: HostRoot) -> None:
    packages.select_version(seeded, KERNEL, "gpu", "999.1")
    with pytest.raises(errors.DepmodFailed, match=r"active version 999\.1 of gpu is not installed"):
        SimKernel(seeded).run_depmod()
    with pytest.raises(errors.DepmodFailed, match=r"could not open directory /lib/modules/5\.4"):
        SimKernel(seeded).run_depmod("5.4")


def test_a_module_built_for_another_kernel_or_corrupt_is_refused(seeded: HostRoot) -> None:
    kernel = SimKernel(seeded)
    other = packages.ModuleStandin("nvidia_peermem", "580.159.04", "6.8.0-49-generic", ("nvidia",))
    path = packages.package_dir(seeded, KERNEL, "gpu", "580.159.04") / "nvidia_peermem.ko"
    path.write_bytes(other.encode())
    with pytest.raises(errors.ModuleLoadFailed, match="Exec format error"):
        kernel.modprobe("nvidia_peermem")
    path.write_bytes(b"\x7fELF garbage")
    kernel.run_depmod()
    with pytest.raises(errors.ModuleLoadFailed, match="Exec format error"):
        kernel.modprobe("nvidia_peermem")


def test_two_kernels_on_one_root_see_one_state(seeded: HostRoot) -> None:
    first, second = SimKernel(seeded), SimKernel(HostRoot(seeded.path))
    first.hold("nvidia", "nvml:a")
    assert second.holders("nvidia") == ("nvml:a",)
    second.rmmod("nvidia_uvm")
    assert not first.is_loaded("nvidia_uvm")
    with pytest.raises(errors.ModuleInUse):
        second.rmmod("nvidia")


def test_a_hold_taken_in_another_process_is_seen_here_and_lasts_as_long_as_its_owner(
    seeded: HostRoot,
) -> None:
    script = (
        "import sys; from pathlib import Path\n"
        "from gpuop.host.roots import HostRoot\nfrom gpuop_sim.host.simkernel import SimKernel\n"
        "kernel = SimKernel(HostRoot(Path(sys.argv[1])))\n"
        "kernel.hold('nvidia', 'nvml:child', owner_pid=int(sys.argv[2]))\n"
        "kernel.hold('nvidia', 'nvml:gone')\n"  # owned by the child, which exits now
    )
    subprocess.run([sys.executable, "-c", script, str(seeded.path), str(os.getpid())], check=True)
    kernel = SimKernel(seeded)
    assert kernel.holders("nvidia") == ("nvml:child",)
    kernel.rmmod("nvidia_uvm")
    with pytest.raises(errors.ModuleInUse) as raised:
        kernel.rmmod("nvidia")
    assert raised.value.holders == ("nvml:child",)


def test_holding_an_unloaded_module_fails_and_bad_names_are_refused(seeded: HostRoot) -> None:
    kernel = SimKernel(seeded)
    with pytest.raises(errors.ModuleNotLoaded):
        kernel.hold("nvidia_drm", "nvml:1")
    with pytest.raises(ValueError, match="holder id"):
        kernel.hold("nvidia", "../escape")
    with pytest.raises(ValueError, match="module name"):
        kernel.holders("../../etc")


def test_a_reboot_ends_holds_unloads_everything_and_changes_the_boot_id(seeded: HostRoot) -> None:
    kernel = SimKernel(seeded)
    kernel.hold("nvidia", "nvml:1")
    boot_id = kernel.reboot(load=["nvidia", "no_such_module"])
    assert boot_id != "8c1f2f5e-0c53-4d57-a0a4-3e3c1b0c9a11"
    assert system.boot_id(seeded) == boot_id
    assert names(seeded) == ["nvidia"]
    assert kernel.holders("nvidia") == ()


def test_seeding_with_ofed_replaces_the_built_in_network_modules(
    recorded: HostRoot, tmp_path: Path
) -> None:
    root = seeding.seed_host_root(tmp_path / "host", recorded.path, ofed_version="24.10-1.1.4")
    assert names(root) == ["mlx5_ib", "ib_core", "mlx5_core", "nvidia_uvm", "nvidia"]
    with pytest.raises(errors.ModuleInUse) as raised:
        SimKernel(root).rmmod("ib_core")
    assert raised.value.holders == ("mlx5_ib",)
    assert modules.module_version(root, "mlx5_core") == "24.10-1.1.4"


def test_seeding_never_writes_the_recording(recorded: HostRoot, tmp_path: Path) -> None:
    before = {p: p.stat().st_mtime_ns for p in recorded.path.rglob("*")}
    root = seeding.seed_host_root(tmp_path / "host", recorded.path, gpu_version=None)
    assert names(root) == []
    assert {p: p.stat().st_mtime_ns for p in recorded.path.rglob("*")} == before


async def test_kernel_ops_load_and_unload_are_idempotent(seeded: HostRoot) -> None:
    kernel = SimKernel(seeded)
    await kernel.load("nvidia")
    await kernel.unload("nvidia_uvm")
    await kernel.unload("nvidia_uvm")
    await kernel.depmod(KERNEL)
    assert [module.name for module in await kernel.loaded()] == ["nvidia"]
    with pytest.raises(errors.ModuleNotFound):
        await kernel.load("nouveau")


def test_a_hold_file_written_directly_counts_as_a_hold(seeded: HostRoot) -> None:
    # the simulated NVML writes its hold files itself, in this layout, without the lock
    hold = seeded.join(f"run/gpuop/sim-kernel/holders/nvidia/nvml-{os.getpid()}")
    hold.parent.mkdir(parents=True, exist_ok=True)
    hold.write_text(f"{os.getpid()}\n")
    kernel = SimKernel(seeded)
    kernel.rmmod("nvidia_uvm")
    assert modules.loaded_modules(seeded)[0].refcount == 1
    with pytest.raises(errors.ModuleInUse) as raised:
        kernel.rmmod("nvidia")
    assert raised.value.holders == (f"nvml-{os.getpid()}",)
