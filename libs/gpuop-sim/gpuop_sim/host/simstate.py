"""Where the simulated kernel keeps its state: in the host root itself, in the files a real
kernel would show, so every reader in `gpuop.host` (in any process) sees the simulation.

    proc/modules                        the loaded modules, newest first (the truth)
    proc/devices                        the character majors of the loaded modules that
                                        register one (`CHARACTER_DEVICES`)
    sys/module/<m>/version, refcnt,     one directory per loaded module; `holders/` has an
        initstate, coresize, taint,     empty file per loaded module that depends on <m>
        srcversion, holders/
    proc/driver/nvidia/                 present while `nvidia` is loaded; its `version` and
                                        each GPU's `GPU Firmware` name the loaded version
    sys/bus/pci/devices/<a>/driver      a link to the bound driver while it is loaded, with
        and uevent `DRIVER=`            `DRIVER=` kept in step (an entry in SYMLINKS.txt
                                        is dropped the first time a binding changes)
    proc/sys/kernel/random/boot_id      replaced by a simulated reboot
    run/gpuop/sim-kernel/lock           `flock`ed around every change
    run/gpuop/sim-kernel/holders/<m>/<holder id>
                                        one file per hold on <m>; it holds the owner's pid
    run/gpuop/sim-kernel/no-gpus/<m>    present while <m> is loaded from a defective build that
                                        brings up no GPU (the simulated NVML sees none)
    run/gpuop/sim-kernel/stash/proc-driver-nvidia
                                        `proc/driver/nvidia` while `nvidia` is unloaded

Only `gpuop_sim.host.simkernel` calls these functions, always under the lock.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuop.host import components, modules, nvidia, parameters, pci, system
from gpuop.host.files import write_atomic
from gpuop.host.modules import LoadedModule
from gpuop.host.packages import ModuleStandin
from gpuop.host.roots import RECORDED_LINKS, HostRoot

STATE_DIR = "run/gpuop/sim-kernel"
LOCK = f"{STATE_DIR}/lock"
HOLDERS = f"{STATE_DIR}/holders"
NO_GPUS = f"{STATE_DIR}/no-gpus"
NVIDIA_STASH = f"{STATE_DIR}/stash/proc-driver-nvidia"
NVIDIA_PROCFS = "proc/driver/nvidia"

DEVICE_DRIVERS = {
    "nvidia": (pci.NVIDIA, pci.DISPLAY_CLASS),
    "mlx5_core": (pci.MELLANOX, pci.NETWORK_CLASS),
}
"""Modules that bind PCI functions when loaded: vendor and base class of what they bind."""

CHARACTER_DEVICES = {
    "nvidia": ((195, "nvidia"), (195, "nvidiactl")),
    "nvidia_modeset": ((195, "nvidia-modeset"),),
    "nvidia_uvm": ((235, "nvidia-uvm"),),
}
"""What each module registers in `/proc/devices` when loaded: NVIDIA's fixed major, and the
unified memory driver's dynamic one (235, as on the recorded node)."""
PROC_DEVICES = "proc/devices"

HOLDER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")
"""What a holder id may look like: it names a file."""
MODULE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def loaded(root: HostRoot) -> list[LoadedModule]:
    """The loaded modules, newest first."""
    return list(modules.loaded_modules(root))


def write_loaded(root: HostRoot, loaded: Sequence[LoadedModule]) -> None:
    """Rewrite `proc/modules` and every loaded module's `refcnt` from the current users
    (dependent modules and holds), where they changed."""
    names = [module.name for module in loaded]
    lines = []
    for module in loaded:
        users = dependents(root, module.name, names)
        refcount = len(users) + len(holds(root, module.name))
        shown = ",".join(users) + "," if users else "-"
        taints = f" ({module.taints})" if module.taints else ""
        lines.append(
            f"{module.name} {module.size} {refcount} {shown} Live 0x0000000000000000{taints}\n"
        )
        refcnt = root.join(f"{modules.SYS_MODULE}/{module.name}/refcnt")
        if refcnt.parent.is_dir():
            _write_if_changed(refcnt, f"{refcount}\n")
    _write_if_changed(root.join(modules.PROC_MODULES), "".join(lines))
    registered = sorted(
        entry for name in reversed(names) for entry in CHARACTER_DEVICES.get(name, ())
    )
    devices = "".join(f"{major:3d} {device}\n" for major, device in registered)
    _write_if_changed(root.join(PROC_DEVICES), f"Character devices:\n{devices}\nBlock devices:\n")


def dependents(root: HostRoot, name: str, loaded_names: Sequence[str]) -> tuple[str, ...]:
    """Loaded modules that depend on `name`: its `holders/` entries, and for modules whose
    holders were never recorded (a fixture's), the known dependency graph."""
    recorded = set(root.list_dir(f"{modules.SYS_MODULE}/{name}/holders"))
    known = set(components.dependents(name))
    return tuple(other for other in loaded_names if other in recorded | known)


def create_module_dir(
    root: HostRoot, standin: ModuleStandin, options: Mapping[str, str] | None = None
) -> None:
    """`sys/module/<name>` for a freshly loaded module, with the parameters it was given in
    `parameters/`, and its name in its needs' holders."""
    base = root.join(f"{modules.SYS_MODULE}/{standin.name}")
    shutil.rmtree(base, ignore_errors=True)
    (base / "holders").mkdir(parents=True)
    source = hashlib.sha256(f"{standin.name} {standin.version}".encode()).hexdigest()
    for name, value in (
        ("version", standin.version),
        ("srcversion", source[:23].upper()),
        ("initstate", "live"),
        ("refcnt", "0"),
        ("coresize", str(standin.size)),
        ("taint", "O"),
    ):
        write_atomic(base / name, value + "\n")
    if options:
        (base / parameters.PARAMETERS).mkdir()
        for name, value in options.items():
            write_atomic(base / parameters.PARAMETERS / name, value + "\n")
    inert = root.join(f"{NO_GPUS}/{standin.name}")
    if standin.brings_up_gpus:
        inert.unlink(missing_ok=True)
    else:
        write_atomic(inert, f"{standin.version}\n")
    for needed in standin.depends:
        holders = root.join(f"{modules.SYS_MODULE}/{needed}/holders")
        if holders.parent.is_dir():
            holders.mkdir(exist_ok=True)
            (holders / standin.name).touch()


def remove_module_dir(root: HostRoot, name: str) -> None:
    """Drop `sys/module/<name>` and `name` from every other module's holders."""
    shutil.rmtree(root.join(f"{modules.SYS_MODULE}/{name}"), ignore_errors=True)
    root.join(f"{NO_GPUS}/{name}").unlink(missing_ok=True)
    for other in root.list_dir(modules.SYS_MODULE):
        root.join(f"{modules.SYS_MODULE}/{other}/holders/{name}").unlink(missing_ok=True)


def holds(root: HostRoot, module: str) -> tuple[str, ...]:
    """Holder ids holding `module`, sorted."""
    return tuple(name for name in root.list_dir(f"{HOLDERS}/{module}") if not name.startswith("."))


def add_hold(root: HostRoot, module: str, holder_id: str, owner_pid: int) -> None:
    write_atomic(root.join(f"{HOLDERS}/{module}/{holder_id}"), f"{owner_pid}\n")


def remove_hold(root: HostRoot, module: str, holder_id: str) -> None:
    root.join(f"{HOLDERS}/{module}/{holder_id}").unlink(missing_ok=True)


def clear_holds(root: HostRoot) -> None:
    shutil.rmtree(root.join(HOLDERS), ignore_errors=True)


def reap_holds(root: HostRoot) -> None:
    """Drop holds whose owner process has died, as the kernel closes a dead process's
    device files."""
    for module in root.list_dir(HOLDERS):
        for holder_id in holds(root, module):
            path = root.join(f"{HOLDERS}/{module}/{holder_id}")
            try:
                owner = int(path.read_text().strip() or "0")
            except (OSError, ValueError):
                owner = 0
            if owner > 0 and not _alive(owner):
                path.unlink(missing_ok=True)


def bind_devices(root: HostRoot, driver: str) -> None:
    """Bind every unbound PCI function that `driver` drives to it."""
    vendor, base_class = DEVICE_DRIVERS[driver]
    for function in pci.pci_functions(root):
        ours = (function.vendor_id, function.base_class) == (vendor, base_class)
        if ours and function.driver is None:
            _set_binding(root, function.address, driver)


def unbind_devices(root: HostRoot, driver: str) -> None:
    """Unbind every PCI function bound to `driver`."""
    for function in pci.pci_functions(root):
        if function.driver == driver:
            _set_binding(root, function.address, None)


def stash_nvidia_procfs(root: HostRoot) -> None:
    """Move `proc/driver/nvidia` aside, as unloading `nvidia` removes it."""
    live, stash = root.join(NVIDIA_PROCFS), root.join(NVIDIA_STASH)
    if live.is_dir():
        shutil.rmtree(stash, ignore_errors=True)
        stash.parent.mkdir(parents=True, exist_ok=True)
        live.rename(stash)


def restore_nvidia_procfs(root: HostRoot, version: str) -> None:
    """Bring `proc/driver/nvidia` back, naming driver `version` in it."""
    live, stash = root.join(NVIDIA_PROCFS), root.join(NVIDIA_STASH)
    arch = system.machine(root) or "x86_64"
    if not live.is_dir():
        if stash.is_dir():
            live.parent.mkdir(parents=True, exist_ok=True)
            stash.rename(live)
        else:
            live.mkdir(parents=True)
    version_file = live / "version"
    try:
        text = nvidia.with_version(version_file.read_text(), version)
    except (OSError, ValueError):
        text = (
            f"NVRM version: NVIDIA UNIX Open Kernel Module for {arch}  {version}"
            "  Release Build  (gpuop-sim@localhost)  \nGCC version:  gcc version 12.2.0 (GCC) \n"
        )
    write_atomic(version_file, text)
    for information in sorted((live / "gpus").glob("*/information")):
        write_atomic(information, nvidia.with_firmware(information.read_text(), version))


def _set_binding(root: HostRoot, address: str, driver: str | None) -> None:
    device = f"{pci.DEVICES}/{address}"
    base = root.resolve(device)
    link = base / "driver"
    if link.is_symlink() or link.exists():
        link.unlink()
    if driver is not None:
        link.symlink_to(f"../../../bus/pci/drivers/{driver}")
    recorded = root.join(RECORDED_LINKS)
    if f"{device}/driver" in root.recorded_links():
        kept = [
            line
            for line in recorded.read_text().splitlines(keepends=True)
            if line.partition(" -> ")[0].strip().strip("/") != f"{device}/driver"
        ]
        write_atomic(recorded, "".join(kept))
    uevent = base / "uevent"
    if uevent.is_file():
        lines = [line for line in uevent.read_text().splitlines() if not line.startswith("DRIVER=")]
        if driver is not None:
            lines.insert(0, f"DRIVER={driver}")
        write_atomic(uevent, "".join(line + "\n" for line in lines))


def _write_if_changed(path: Path, text: str) -> None:
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    write_atomic(path, text)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited; only its parent has not collected it yet
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]
