"""Unloading and loading one driver stack's kernel modules through `KernelOps`.

Called by `executor.Executor` for `UnloadDriver`, `LoadDriver` and `RollbackDriver`:

- `unload` removes the component's loaded modules dependents first
  (`components.unload_order`). While the kernel says a module is in use it retries every
  `unload_poll_seconds` until the command's timeout, then puts back what it had removed
  (the node keeps running the old driver, complete) and fails with the holders: dependent
  modules from the kernel's answer, processes from the host's `proc`. An OFED unload that
  would reset the interface carrying the node's default route is refused unless the command
  opts in.
- `load` makes `version` the active one (`packages.select_version`: this, not the install,
  is when the active version changes) and, for a format 2 package, its user space the one
  in use (`installing.select_userspace`, put back when the load fails; a rollback's load
  switches back), runs depmod and loads the modules in dependency order, then checks that
  the loaded module reports `version`. A GPU driver's load then makes its control device
  nodes (`gpuop.host.devnodes`: `/dev/nvidiactl`, `/dev/nvidia-uvm`, ...) as NVIDIA's
  toolkit does, so the CDI spec written next names them; a node it cannot make is logged
  and the load stands (the spec names what the host has).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from gpuop.clocks import Clock
from gpuop.events.driver import Component, LoadFailureReason, Process, UnloadFailureReason
from gpuop.host import components, devnodes, modules, packages, parameters
from gpuop.host.errors import (
    KernelError,
    KernelToolTimedOut,
    ModuleInUse,
)
from gpuop.host.protocol import KernelOps
from gpuop.host.roots import HostRoot
from gpuop.services.driver_manager import holders, installing
from gpuop.services.driver_manager.installing import InstallError, running_kernel

log = logging.getLogger(__name__)


class UnloadError(Exception):
    """The modules could not be unloaded; the ones removed were loaded again."""

    def __init__(
        self,
        reason: UnloadFailureReason,
        message: str,
        *,
        holding_modules: tuple[str, ...] = (),
        holding_processes: tuple[Process, ...] = (),
        retryable: bool = False,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.holding_modules = holding_modules
        self.holding_processes = holding_processes
        self.retryable = retryable


class LoadError(Exception):
    """The driver could not be loaded at the version asked for."""

    def __init__(self, reason: LoadFailureReason, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retryable = retryable


class Reloader:
    """Unloads and loads the modules of one host's driver stacks."""

    def __init__(
        self, root: HostRoot, kernel: KernelOps, clock: Clock, poll_seconds: float
    ) -> None:
        self.root = root
        self.kernel = kernel
        self.clock = clock
        self.poll_seconds = poll_seconds

    async def loaded_modules(self, component: Component) -> tuple[str, ...]:
        """The component's modules loaded now, in load order."""
        names = {module.name for module in await self.kernel.loaded()}
        return tuple(m for m in components.modules_of(component) if m in names)

    def loaded_version(self, component: Component) -> str | None:
        """Version of the component's main module (`nvidia`, `mlx5_core`) when loaded."""
        return modules.module_version(self.root, components.modules_of(component)[0])

    async def unload(
        self, component: Component, timeout_seconds: float, allow_management: bool
    ) -> tuple[str, ...]:
        """Unload the component; the modules removed, in removal order."""
        present = await self.loaded_modules(component)
        if not present:
            return ()
        if component is Component.OFED and not allow_management:
            cut_off = holders.management_interfaces(self.root, component)
            if cut_off:
                raise UnloadError(
                    UnloadFailureReason.MANAGEMENT_INTERFACE,
                    f"refusing to unload {component}: {', '.join(cut_off)} carries the node's "
                    "default route and would go down (the GPUClusterPolicy allows it with "
                    "spec.network.allowManagementNicReload)",
                )
        deadline = self.clock.monotonic() + timeout_seconds
        removed: list[str] = []
        for module in components.unload_order(present):
            while True:
                try:
                    await self.kernel.unload(module)
                except ModuleInUse as exc:
                    if self.clock.monotonic() + self.poll_seconds <= deadline:
                        await self.clock.sleep(self.poll_seconds)
                        continue
                    await self._restore(removed)
                    raise await self._in_use(component, exc) from None
                except KernelToolTimedOut as exc:
                    await self._restore(removed)
                    raise UnloadError(
                        UnloadFailureReason.TIMEOUT, str(exc), retryable=True
                    ) from None
                except KernelError as exc:
                    await self._restore(removed)
                    raise UnloadError(UnloadFailureReason.MODULE_ERROR, str(exc)) from None
                removed.append(module)
                break
        return tuple(removed)

    async def load(
        self,
        component: Component,
        version: str,
        wanted: tuple[str, ...],
        options: Mapping[str, Mapping[str, str]] | None = None,
    ) -> tuple[str, ...]:
        """Select `version`, index it and load `wanted`, each module with its `options`
        (the policy's parameters); the component's modules now loaded."""
        try:
            kernel_release = running_kernel(self.root)
        except InstallError as exc:
            raise LoadError(LoadFailureReason.OTHER, exc.message) from None
        installed = packages.installed_versions(self.root, kernel_release, component)
        if version not in installed:
            raise LoadError(
                LoadFailureReason.MODULE_ERROR,
                f"{component} {version} is not installed for kernel {kernel_release} "
                f"(installed: {', '.join(installed) or 'none'})",
            )
        running = self.loaded_version(component)
        if running is not None and running != version:
            raise LoadError(
                LoadFailureReason.VERSION_MISMATCH,
                f"{component} {running} is loaded; unload it before loading {version}",
            )
        packages.select_version(self.root, kernel_release, component, version)
        # a format 2 version's user space switches with its modules: one link's rename
        previous = installing.select_userspace(self.root, component, version)
        # for the loads it does not make too (the boot after a reboot)
        parameters.write_options(self.root, str(component), options or {})
        try:
            await self.kernel.depmod(kernel_release)
            for module in components.load_order(wanted):
                await self.kernel.load(module, (options or {}).get(module))
        except KernelToolTimedOut as exc:
            installing.restore_userspace(self.root, component, previous)
            raise LoadError(LoadFailureReason.TIMEOUT, str(exc), retryable=True) from None
        except KernelError as exc:
            installing.restore_userspace(self.root, component, previous)
            raise LoadError(LoadFailureReason.MODULE_ERROR, str(exc)) from None
        now = self.loaded_version(component)
        if now != version:
            raise LoadError(
                LoadFailureReason.VERSION_MISMATCH,
                f"asked for {component} {version}, the kernel runs {now or 'nothing'}",
            )
        if component is Component.GPU:
            self._make_device_nodes()
        return await self.loaded_modules(component)

    def parameters_shown(
        self, options: Mapping[str, Mapping[str, str]]
    ) -> dict[str, dict[str, str]]:
        """Each parameter of `options` as its loaded module shows it now; one it does not
        show is left out (the kernel ignored it: the module does not declare it) and logged."""
        shown: dict[str, dict[str, str]] = {}
        for module, asked in sorted(options.items()):
            now = parameters.shown(self.root, module)
            took = {name: now[name] for name in sorted(asked) if name in now}
            ignored = sorted(set(asked) - set(took))
            if ignored:
                log.warning("%s shows no parameter %s: ignored", module, ", ".join(ignored))
            if took:
                shown[module] = took
        return shown

    def _make_device_nodes(self) -> None:
        try:
            made = devnodes.create(self.root)
        except devnodes.DeviceNodeError as exc:
            log.warning("the GPU driver's control device nodes: %s", exc)
            return
        if made:
            log.info("made the device nodes %s", ", ".join(made))

    async def _restore(self, removed: list[str]) -> None:
        """Put back modules removed before a failure, so the old driver runs complete."""
        for module in components.load_order(removed):
            try:
                await self.kernel.load(module)
            except KernelError as exc:
                log.error("could not load %s again after a failed unload: %s", module, exc)

    async def _in_use(self, component: Component, exc: ModuleInUse) -> UnloadError:
        loaded = {module.name for module in await self.kernel.loaded()}
        holding_modules = tuple(h for h in exc.holders if h in loaded)
        processes = holders.processes_holding(self.root, component)
        message = str(exc)
        if processes:
            message += "; processes: " + " ".join(f"{p.name}[{p.pid}]" for p in processes)
        return UnloadError(
            UnloadFailureReason.IN_USE,
            message[:2048],
            holding_modules=holding_modules,
            holding_processes=processes,
            retryable=True,
        )
