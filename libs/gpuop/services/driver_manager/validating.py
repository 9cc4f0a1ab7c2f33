"""Checking that a loaded driver works, and counting the devices it drives.

Called by `executor.Executor`: `count_devices` before an unload (the count a later
validation expects when the command names none), `validate` for `ValidateDriver`.

- GPU: an NVML session from the configured backend (`--nvml`), opened for the check and
  closed after it (an open session holds the `nvidia` module): the driver version must be the
  one asked for and NVML must see at least the expected number of GPUs. NVML that cannot
  start yet, or sees too few GPUs, is asked again every `poll_seconds` until the command's
  timeout; a wrong version fails at once.
- GPU, before NVML: the user space must be the loaded module's (`user_space_mismatch`): the
  driver's own report (`proc/driver/nvidia/version`) names the module's version, the user
  space in use (the `opt/gpuop/gpu/current` link a format 2 install switches with the
  modules) is that version's, and its `libnvidia-ml.so.<version>` is too. NVML refuses to
  run against a kernel module of another version, so a mismatch would only show as NVML
  failing until the timeout; it fails at once with both versions named.
- OFED: `mlx5_core` must report the version, and the Mellanox network functions bound to it
  are the devices.

The validation ladder's driver rungs after that NVML rung (`ValidateDriver.check`; the
policy's `upgradePolicy.validation` chooses them), each after the same version checks:

- `cuda`: a `gpuop.host.cuda.CudaProbe` creates a context on every GPU (on a node, the
  installed libcuda in a child process killed at the timeout); a CUDA error fails the rung
  at once with its name and number (`cuda-failed`), as does a count below the expected one.
- `peermem`: `nvidia_peermem` is loaded and, where the RDMA core keeps a registry of peer
  memory clients (`sys/kernel/mm/memory_peers`, MLNX_OFED), registered there as `nv_mem`
  (`peermem-not-registered`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

from gpuop.clocks import Clock
from gpuop.events.driver import Component, LoadFailureReason, ValidationCheck
from gpuop.host import components, modules, nvidia, pci
from gpuop.host.cuda import CudaProbe
from gpuop.host.errors import HostReadError
from gpuop.host.roots import HostRoot
from gpuop.nvml import Nvml, NvmlError, opened
from gpuop.services.driver_manager import installing

NvmlFactory = Callable[[], Nvml]
"""Builds a closed NVML session; `open_backend` with the agent's `--nvml`."""


class ValidationFailed(Exception):
    """The driver is loaded but not usable as asked."""

    def __init__(self, reason: LoadFailureReason, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retryable = retryable


class Validator:
    """Validates the drivers of one host."""

    def __init__(
        self,
        root: HostRoot,
        nvml: NvmlFactory,
        clock: Clock,
        cuda: CudaProbe,
        poll_seconds: float = 1.0,
    ) -> None:
        self.root = root
        self.nvml = nvml
        self.clock = clock
        self.cuda = cuda
        self.poll_seconds = poll_seconds

    async def count_devices(self, component: Component) -> int | None:
        """Devices the loaded driver sees now; None when it cannot say."""
        if component is Component.OFED:
            return _bound_network_functions(self.root)
        try:
            _, count = await asyncio.to_thread(self._ask_nvml)
        except NvmlError:
            return None
        return count

    async def validate(
        self,
        component: Component,
        version: str,
        expected: int | None,
        timeout_seconds: float,
        check: ValidationCheck = ValidationCheck.NVML,
    ) -> int:
        """The number of devices the driver sees; `ValidationFailed` when it is not usable
        (the `check` rung failed)."""
        main = components.modules_of(component)[0]
        running = modules.module_version(self.root, main)
        if running is None:
            raise ValidationFailed(LoadFailureReason.MODULE_ERROR, f"{main} is not loaded")
        if running != version:
            raise ValidationFailed(
                LoadFailureReason.VERSION_MISMATCH, f"{main} {running} is loaded, not {version}"
            )
        if component is Component.GPU:
            mismatch = user_space_mismatch(self.root, running)
            if mismatch is not None:
                raise ValidationFailed(LoadFailureReason.VERSION_MISMATCH, mismatch)
        if check is ValidationCheck.CUDA:
            return await self._cuda(version, expected, timeout_seconds)
        if check is ValidationCheck.PEERMEM:
            peermem_registered(self.root)
            return expected or 0  # the rung counts no devices: the NVML rung did
        deadline = self.clock.monotonic() + timeout_seconds
        while True:
            try:
                return await self._check(component, version, expected)
            except ValidationFailed as failure:
                if not failure.retryable or self.clock.monotonic() >= deadline:
                    raise
            await self.clock.sleep(self.poll_seconds)

    async def _check(self, component: Component, version: str, expected: int | None) -> int:
        if component is Component.OFED:
            count = _bound_network_functions(self.root)
        else:
            try:
                reported, count = await asyncio.to_thread(self._ask_nvml)
            except NvmlError as exc:
                raise ValidationFailed(
                    LoadFailureReason.UNHEALTHY, f"NVML fails: {exc}", retryable=True
                ) from None
            if reported != version:
                raise ValidationFailed(
                    LoadFailureReason.VERSION_MISMATCH,
                    f"NVML reports driver {reported}, not {version}",
                )
        if expected is not None and count < expected:
            raise ValidationFailed(
                LoadFailureReason.NO_DEVICES,
                f"the {component} driver sees {count} devices, {expected} expected",
                retryable=True,
            )
        if expected is None and count == 0:
            raise ValidationFailed(
                LoadFailureReason.NO_DEVICES,
                f"the {component} driver sees no devices",
                retryable=True,
            )
        return count

    async def _cuda(self, version: str, expected: int | None, timeout_seconds: float) -> int:
        report = await self.cuda.probe(version, timeout_seconds)
        if not report.ok:
            raise ValidationFailed(LoadFailureReason.CUDA_FAILED, report.describe())
        if expected is not None and report.devices < expected:
            raise ValidationFailed(
                LoadFailureReason.NO_DEVICES,
                f"CUDA sees {report.devices} GPUs, {expected} expected",
            )
        return report.devices

    def _ask_nvml(self) -> tuple[str, int]:
        with opened(self.nvml()) as nvml:
            return nvml.driver_version(), nvml.device_count()


_NVML_LIBRARY = re.compile(r"^libnvidia-ml\.so\.(\d+(?:\.\d+)+)$")


def user_space_mismatch(root: HostRoot, module_version: str) -> str | None:
    """Why the GPU driver's user space is not the loaded module's `module_version`, or None:
    the driver's report in procfs names another version, the user space in use is another
    version's, or that version's `libnvidia-ml.so.<version>` is another. A host without a
    user space switched by gpuop (format 1 packages) is judged by procfs alone."""
    try:
        reported = nvidia.driver_version(root)
    except HostReadError as error:
        return f"the NVIDIA driver's report is unreadable: {error}"
    if reported is not None and reported.version != module_version:
        return (
            f"{nvidia.VERSION_FILE} reports driver {reported.version}, "
            f"the loaded nvidia module is {module_version}"
        )
    component = str(Component.GPU)
    in_use = installing.active_userspace(root, component)
    if in_use is None:
        return None
    if in_use != module_version:
        return (
            f"the user space in use ({installing.USERSPACE}/{component}/{installing.CURRENT}) "
            f"is {in_use}, the loaded nvidia module is {module_version}"
        )
    libraries = installing.userspace_dir(root, component, in_use) / "lib"
    found = sorted(
        m[1] for p in libraries.glob("libnvidia-ml.so.*") if (m := _NVML_LIBRARY.match(p.name))
    )
    if found and module_version not in found:
        return (
            f"the user space {in_use} holds libnvidia-ml.so.{', '.join(found)}, "
            f"the loaded nvidia module is {module_version}"
        )
    return None


PEERMEM = "nvidia_peermem"
MEMORY_PEERS = "sys/kernel/mm/memory_peers"
"""MLNX_OFED's registry of peer memory clients: one directory per client with a `version`."""
PEERMEM_CLIENT = "nv_mem"
"""The name nvidia_peermem registers under (as nv_peer_mem did before it)."""


def peermem_registered(root: HostRoot) -> None:
    """Nothing when `nvidia_peermem` is loaded and, where the RDMA core keeps a registry of peer
    memory clients, registered in it; `ValidationFailed` otherwise. Newer MLNX_OFED and the
    inbox RDMA core have no registry: the loaded module, whose load needs ib_core's peer
    memory API, is then the proof."""
    if modules.module_info(root, PEERMEM) is None:
        raise ValidationFailed(LoadFailureReason.PEERMEM_NOT_REGISTERED, f"{PEERMEM} is not loaded")
    registry = root.resolve(MEMORY_PEERS)
    if registry.is_dir() and not (registry / PEERMEM_CLIENT / "version").is_file():
        clients = ", ".join(sorted(p.name for p in registry.iterdir())) or "none"
        raise ValidationFailed(
            LoadFailureReason.PEERMEM_NOT_REGISTERED,
            f"{PEERMEM} is loaded but {PEERMEM_CLIENT} is not in {MEMORY_PEERS} "
            f"(registered: {clients})",
        )


def _bound_network_functions(root: HostRoot) -> int:
    try:
        functions = pci.pci_functions(root)
    except HostReadError:
        return 0
    drivers = set(components.modules_of(Component.OFED))
    return sum(
        1
        for function in functions
        if function.vendor_id == pci.MELLANOX
        and function.base_class == pci.NETWORK_CLASS
        and function.driver in drivers
    )
