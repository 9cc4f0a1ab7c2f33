"""The seam between node agents and the kernel: one Protocol for loading, unloading and
indexing kernel modules.

The driver-manager receives a `KernelOps` in its constructor: `SubprocessKernelOps` on a
node (modprobe, rmmod and depmod chrooted into the host root), `SimKernel` in the demo and
in tests, or `SubprocessKernelOps(chroot=False)` with the stand-in tools of
`gpuop_sim.host.standins` on PATH to exercise the real subprocess path against a simulated host.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from gpuop.host.cuda import CudaProbe
from gpuop.host.modules import LoadedModule
from gpuop.host.resets import FunctionResets
from gpuop.host.restarting import RuntimeService


class KernelOps(Protocol):
    """Kernel module operations on one host. Failures raise `gpuop.host.errors.KernelError`."""

    async def loaded(self) -> tuple[LoadedModule, ...]:
        """The loaded modules with their use counts and users, as `proc/modules` lists them."""
        ...

    async def load(self, module: str, options: Mapping[str, str] | None = None) -> None:
        """Load `module` and what it depends on, as `modprobe` does; nothing when loaded.
        `options`: `module`'s parameters (`modprobe nvidia NVreg_EnableGpuFirmware=0`); the
        kernel ignores one the module does not declare and refuses a value its type does not
        take (`ModuleLoadFailed`, "Invalid argument").

        Raises `ModuleNotFound` when the running kernel has no such module installed and
        indexed, `ModuleLoadFailed` when the kernel refuses it.
        """
        ...

    async def unload(self, module: str) -> None:
        """Unload `module` only, as `rmmod` does; nothing when it is not loaded.

        The caller unloads dependents first (`components.unload_order`). Raises
        `ModuleInUse` with the holders while anything uses it, `ModuleUnloadFailed` for any
        other refusal (a module built into the kernel).
        """
        ...

    async def depmod(self, kernel_release: str) -> None:
        """Rebuild the module index of `kernel_release` after packages were installed or
        removed, so `load` finds the active version. Raises `DepmodFailed`."""
        ...


class Rebooter(Protocol):
    """Reboots a node."""

    async def reboot(self) -> None:
        """Start the reboot; on a real node, this process dies soon after."""
        ...


class SimulatedHost(Protocol):
    """A host that a plugin simulates under a host root (entry point group `gpuop.kernels`,
    name `simulated`): its kernel, and a reboot that reboots the simulation, never the
    machine the agent runs on."""

    kernel: KernelOps
    rebooter: Rebooter
    runtime: RuntimeService
    """The simulated node's container runtime, restarted by the runtime-configure step."""
    function_resets: FunctionResets
    """The resets of one GPU alone, which the simulated NVML sees (`ResetGpu`)."""

    def cuda_probe(self, count_gpus: Callable[[], int]) -> CudaProbe:
        """The validation ladder's CUDA probe of the simulated node, whose GPUs are those
        `count_gpus` (the simulated NVML) sees."""
        ...
