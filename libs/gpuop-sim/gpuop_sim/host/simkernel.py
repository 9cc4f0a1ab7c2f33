"""A simulated kernel that keeps its module state in a host root directory.

The demo and the tests give it to the driver-manager instead of `SubprocessKernelOps`; the
stand-in `modprobe`, `rmmod` and `depmod` of `gpuop_sim.host.standins` run it behind the real
subprocess path; the simulated NVML holds `nvidia` through it while a handle is open. Its
state is the host root's own files (`gpuop_sim.host.simstate` draws the layout), changed under
one `flock`, so several processes sharing a host root (the demo runs each service as its
own process) see one kernel, and every reader in `gpuop.host` sees what it did.

Rules, as the real kernel and kmod have them:
- `modprobe` loads a module found in `modules.dep` of the running kernel, after what it
  needs; it checks the module stand-in was built for this kernel (else "Exec format
  error"). Loading `nvidia` brings back `proc/driver/nvidia` with its version and binds the
  NVIDIA GPUs; loading `mlx5_core` binds the Mellanox network functions.
- `rmmod` removes one module; it refuses while a loaded module depends on it or a holder
  holds it (`ModuleInUse`), and refuses a module built into the kernel.
- Holders: `hold(module, holder_id)` is an open handle on the module's device files (the
  simulated NVML holds `nvidia` per open session). A hold ends with `release`, or when the
  process that took it dies, as the kernel closes a dead process's files.
- `depmod` indexes the active version of each installed component (`gpuop.host.packages`).
- Each load of `nvidia` counts as a reset of every GPU (`gpuop_sim.host.simreset`), and a GPU
  wedged by the `stuck` fault keeps it from loading until a reboot.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from gpuop import moduleparams
from gpuop.host import indexing, modules, packages, parameters, system
from gpuop.host.errors import (
    HostReadError,
    KernelError,
    ModuleInUse,
    ModuleLoadFailed,
    ModuleNotFound,
    ModuleNotLoaded,
    ModuleUnloadFailed,
)
from gpuop.host.files import exclusive_lock, write_atomic
from gpuop.host.modules import LoadedModule
from gpuop.host.roots import HostRoot
from gpuop_sim.host import simkmsg, simreset, simstate

_EXEC_FORMAT = "Exec format error"
_UNKNOWN_SYMBOL = "Unknown symbol in module, or unknown parameter (see dmesg)"
_INVALID_ARGUMENT = "Invalid argument"


class SimKernel:
    """The kernel of a simulated node whose `/` is `root`; a `KernelOps`."""

    def __init__(self, root: HostRoot) -> None:
        self.root = root

    # KernelOps

    async def loaded(self) -> tuple[LoadedModule, ...]:
        return modules.loaded_modules(self.root)

    async def load(self, module: str, options: Mapping[str, str] | None = None) -> None:
        await asyncio.to_thread(self.modprobe, module, options)

    async def unload(self, module: str) -> None:
        with suppress(ModuleNotLoaded):
            await asyncio.to_thread(self.rmmod, module)

    async def depmod(self, kernel_release: str) -> None:
        await asyncio.to_thread(self.run_depmod, kernel_release)

    # The tools, synchronously: what the stand-in executables call.

    def modprobe(self, module: str, options: Mapping[str, str] | None = None) -> None:
        """Load `module` and what it needs; nothing when it is loaded or built in.
        `options`: `module`'s parameters (not its needs'), after those `etc/modprobe.d` gives
        every module (`gpuop.host.parameters.configured`), each one it declares shown in
        `sys/module/<module>/parameters/`; one it does not declare is ignored, as the kernel
        does ("unknown parameter ignored"), and a value its type does not take fails the
        load ("Invalid argument")."""
        name = module.replace("-", "_")
        with self._locked() as loaded:
            if self._present(name, loaded):
                return
            kernel_release = self.kernel_release()
            entry = indexing.read_index(self.root, kernel_release).get(name)
            if entry is None:
                raise ModuleNotFound(name, kernel_release)
            base = packages.modules_dir(self.root, kernel_release)
            configured = parameters.configured(self.root)
            for path in (*reversed(entry.dependencies), entry.path):
                needed = indexing.module_name(path)
                if not self._present(needed, loaded):
                    given = {
                        **configured.get(needed, {}),
                        **((options or {}) if needed == name else {}),
                    }
                    self._insert(needed, base / path, kernel_release, loaded, given)

    def rmmod(self, module: str) -> None:
        """Unload `module` only. Raises `ModuleNotLoaded`, `ModuleInUse` with the dependent
        modules then the holder ids, or `ModuleUnloadFailed` for a built-in module."""
        name = module.replace("-", "_")
        with self._locked() as loaded:
            names = [entry.name for entry in loaded]
            if name not in names:
                info = modules.module_info(self.root, name)
                if info is not None and info.builtin:
                    raise ModuleUnloadFailed(name, f"Module {name} is builtin.")
                raise ModuleNotLoaded(name)
            users = simstate.dependents(self.root, name, names)
            held = simstate.holds(self.root, name)
            if users or held:
                raise ModuleInUse(name, (*users, *held))
            self._remove(name, loaded)

    def run_depmod(self, kernel_release: str | None = None) -> None:
        """Index the active modules of `kernel_release` (default: the running kernel's)."""
        with self._locked():
            indexing.write_index(self.root, kernel_release or self.kernel_release())

    # Holders: the API the simulated NVML uses.

    def hold(self, module: str, holder_id: str, *, owner_pid: int | None = None) -> None:
        """Hold loaded `module` open as `holder_id` (idempotent): `rmmod` refuses it with
        `ModuleInUse` until `release`, or until process `owner_pid` (default: the caller)
        dies. `holder_id` is a short name such as `telemetry:4211`; `ValueError` when it
        is not one. Raises `ModuleNotLoaded` when the module is not loaded, as opening a
        device file of an absent driver fails."""
        _check(module, holder_id)
        with self._locked() as loaded:
            if module not in {entry.name for entry in loaded}:
                raise ModuleNotLoaded(module)
            simstate.add_hold(self.root, module, holder_id, owner_pid or os.getpid())
            simstate.write_loaded(self.root, loaded)

    def release(self, module: str, holder_id: str) -> None:
        """End `holder_id`'s hold on `module`; nothing when it holds none."""
        _check(module, holder_id)
        with self._locked() as loaded:
            simstate.remove_hold(self.root, module, holder_id)
            simstate.write_loaded(self.root, loaded)

    def holders(self, module: str) -> tuple[str, ...]:
        """The holder ids holding `module` now, sorted (dependent modules not included)."""
        _check(module)
        with self._locked():
            return simstate.holds(self.root, module)

    def is_loaded(self, module: str) -> bool:
        """Whether `module` is loaded (built-in modules are not)."""
        return any(entry.name == module for entry in modules.loaded_modules(self.root))

    # The machine.

    def kernel_release(self) -> str:
        """The running kernel's release; `HostReadError` when the root does not say."""
        release = system.kernel_release(self.root)
        if release is None:
            raise HostReadError(self.root.join(system.OSRELEASE), "missing, as is proc/version")
        return release

    def reboot(self, *, load: Sequence[str] = (), boot_id: str | None = None) -> str:
        """Restart the simulated machine: every hold ends, every loaded module goes, a new
        boot id is written; then `load` is loaded, each as far as it can be (a module that
        fails to load at boot leaves the node up without it). Returns the new boot id."""
        new_boot_id = boot_id or str(uuid.uuid4())
        with self._locked() as loaded:
            simstate.clear_holds(self.root)
            for entry in list(loaded):
                self._remove(entry.name, loaded)
            write_atomic(self.root.join(system.BOOT_ID), new_boot_id + "\n")
            simreset.rebooted(self.root)
            simkmsg.boot(self.root)
        for module in load:
            try:
                self.modprobe(module)
            except KernelError:
                continue
        return new_boot_id

    @contextmanager
    def _locked(self) -> Iterator[list[LoadedModule]]:
        with exclusive_lock(self.root.join(simstate.LOCK)):
            loaded = simstate.loaded(self.root)
            simstate.reap_holds(self.root)
            # holds may have come and gone without us (the simulated NVML writes its hold
            # files itself): bring the use counts up to date before acting on them
            simstate.write_loaded(self.root, loaded)
            yield loaded

    def _present(self, name: str, loaded: list[LoadedModule]) -> bool:
        if any(entry.name == name for entry in loaded):
            return True
        info = modules.module_info(self.root, name)
        return info is not None and info.builtin

    def _insert(
        self,
        name: str,
        path: os.PathLike[str],
        kernel_release: str,
        loaded: list[LoadedModule],
        options: Mapping[str, str],
    ) -> None:
        try:
            standin = indexing.declared_module(Path(path))
        except (OSError, ValueError):
            raise ModuleLoadFailed(name, _EXEC_FORMAT) from None
        if standin.name != name or standin.kernel_release != kernel_release:
            raise ModuleLoadFailed(name, _EXEC_FORMAT)
        if not all(self._present(needed, loaded) for needed in standin.depends):
            raise ModuleLoadFailed(name, _UNKNOWN_SYMBOL)
        if name == "nvidia" and simreset.wedged(self.root):
            raise ModuleLoadFailed(name, "No such device")  # RmInitAdapter failed
        declared = dict(standin.parameters)
        taken = {k: v for k, v in options.items() if k in declared}
        if any(moduleparams.value_problem(v, declared[k]) for k, v in taken.items()):
            raise ModuleLoadFailed(name, _INVALID_ARGUMENT)
        simstate.create_module_dir(self.root, standin, taken)
        loaded.insert(0, LoadedModule(name, standin.size, 0, (), "Live", taints="O"))
        if name == "nvidia":
            simstate.restore_nvidia_procfs(self.root, standin.version)
            simreset.driver_loaded(self.root)
        if name in simstate.DEVICE_DRIVERS:
            simstate.bind_devices(self.root, name)
        simstate.write_loaded(self.root, loaded)

    def _remove(self, name: str, loaded: list[LoadedModule]) -> None:
        if name in simstate.DEVICE_DRIVERS:
            simstate.unbind_devices(self.root, name)
        if name == "nvidia":
            simstate.stash_nvidia_procfs(self.root)
        simstate.remove_module_dir(self.root, name)
        loaded[:] = [entry for entry in loaded if entry.name != name]
        simstate.write_loaded(self.root, loaded)


def _check(module: str, holder_id: str | None = None) -> None:
    # both become file names under the host root
    if not simstate.MODULE_NAME.match(module):
        raise ValueError(f"not a module name: {module!r}")
    if holder_id is not None and not simstate.HOLDER_ID.match(holder_id):
        raise ValueError(f"not a holder id: {holder_id!r}")
