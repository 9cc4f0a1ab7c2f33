"""Resetting one GPU alone: the kernel's PCI function reset, written through the host root.

The driver-manager's `resetting.GpuResetter` calls a `FunctionResets` for each GPU it may
reset alone. NVML has no public device reset (`nvidia-smi --gpu-reset` reaches the driver
through private calls, and its output is no interface to parse), so the real path is the
kernel's own: writing `1` to `/sys/bus/pci/devices/<address>/reset` makes the kernel reset
that one PCI function (a function-level reset where the GPU offers one, else the bus
reset the kernel picks), saving and restoring its configuration space around it. The file
is absent when the kernel can reset the function no way at all.

What must hold before (the caller checks it): no process holds the GPU's device file, since
its contexts die with the reset; on HGX boards the other GPUs may run, as `nvidia-smi(1)`
says of Ampere and later GPUs, which reset one at a time (NVSwitch systems of Hopper and
later without Fabric Manager). What must hold after (the caller checks that too, through
NVML): the GPU answers, with no uncorrectable volatile ECC error or pending row remap.

`SysfsFunctionResets` is the real host's; the simulated host (plugin `gpuop.kernels:
simulated`) brings its own, which records the reset where the simulated NVML sees it.
"""

from __future__ import annotations

import asyncio
import errno
import re
from typing import Protocol

from gpuop.host import pci
from gpuop.host.roots import HostRoot

_NVML_BUS_ID = re.compile(
    r"^(?P<domain>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):(?P<device>[0-9a-fA-F]{2})\.(?P<fn>[0-7])$"
)


class FunctionResetFailed(Exception):
    """The kernel did not reset the function; the message says what it answered."""


class FunctionResets(Protocol):
    """Resets of one GPU's PCI function on one host."""

    def offered(self, pci_bus_id: str) -> bool:
        """Whether the host can reset the function at `pci_bus_id` (NVML's form,
        `00000000:18:00.0`) alone."""
        ...

    async def reset(self, pci_bus_id: str) -> None:
        """Reset the function; raises `FunctionResetFailed`."""
        ...


def sysfs_address(pci_bus_id: str) -> str:
    """NVML's bus id (`00000000:18:00.0`) as sysfs names the function (`0000:18:00.0`);
    `ValueError` for anything else."""
    found = _NVML_BUS_ID.match(pci_bus_id)
    if found is None:
        raise ValueError(f"not a PCI bus id: {pci_bus_id!r}")
    domain = int(found["domain"], 16)
    return f"{domain:04x}:{found['bus'].lower()}:{found['device'].lower()}.{found['fn']}"


def reset_file(pci_bus_id: str) -> str:
    """The sysfs file whose write resets the function, relative to the host root."""
    return f"{pci.DEVICES}/{sysfs_address(pci_bus_id)}/reset"


class SysfsFunctionResets:
    """`FunctionResets` through `sys/bus/pci/devices/<address>/reset` under the host root."""

    def __init__(self, root: HostRoot) -> None:
        self.root = root

    def offered(self, pci_bus_id: str) -> bool:
        return self.root.resolve(reset_file(pci_bus_id)).exists()

    async def reset(self, pci_bus_id: str) -> None:
        await asyncio.to_thread(self._write, pci_bus_id)

    def _write(self, pci_bus_id: str) -> None:
        path = self.root.resolve(reset_file(pci_bus_id))
        try:
            with open(path, "w", encoding="ascii") as stream:
                stream.write("1")
        except OSError as exc:
            reason = errno.errorcode.get(exc.errno or 0, "error")
            raise FunctionResetFailed(
                f"writing 1 to /{reset_file(pci_bus_id)} failed: {exc.strerror} ({reason})"
            ) from None
