"""Checking that a loaded driver works, and counting the devices it drives.

Called by `executor.Executor`: `count_devices` before an unload (the count a later
validation expects when the command names none), `validate` for `ValidateDriver`.

- GPU: an NVML session from the configured backend (`--nvml`), opened for the check and
  closed after it (an open session holds the `nvidia` module): the driver version must be the
  one asked for and NVML must see at least the expected number of GPUs. NVML that cannot
  start yet, or sees too few GPUs, is asked again every `poll_seconds` until the command's
  timeout; a wrong version fails at once.
- OFED: `mlx5_core` must report the version, and the Mellanox network functions bound to it
  are the devices.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gpuop.clocks import Clock
from gpuop.events.driver import Component, LoadFailureReason
from gpuop.host import components, modules, pci
from gpuop.host.errors import HostReadError
from gpuop.host.roots import HostRoot
from gpuop.nvml import Nvml, NvmlError, opened

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
        self, root: HostRoot, nvml: NvmlFactory, clock: Clock, poll_seconds: float = 1.0
    ) -> None:
        self.root = root
        self.nvml = nvml
        self.clock = clock
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
        self, component: Component, version: str, expected: int | None, timeout_seconds: float
    ) -> int:
        """The number of devices the driver sees; `ValidationFailed` when it is not usable."""
        main = components.modules_of(component)[0]
        running = modules.module_version(self.root, main)
        if running is None:
            raise ValidationFailed(LoadFailureReason.MODULE_ERROR, f"{main} is not loaded")
        if running != version:
            raise ValidationFailed(
                LoadFailureReason.VERSION_MISMATCH, f"{main} {running} is loaded, not {version}"
            )
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

    def _ask_nvml(self) -> tuple[str, int]:
        with opened(self.nvml()) as nvml:
            return nvml.driver_version(), nvml.device_count()


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
