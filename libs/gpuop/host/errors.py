"""Every error `gpuop.host` raises, in one tree.

    HostError                   something about the node's host
    ├── HostReadError           a file under the host root is unreadable or malformed; names it
    └── KernelError             a kernel module operation did not do what was asked
        ├── ModuleInUse         unload refused: dependent modules or open handles hold it
        ├── ModuleNotLoaded     the module is not loaded (rmmod of an absent module, a hold
        │                       on one); `KernelOps.unload` treats it as done, never raises it
        ├── ModuleNotFound      no such module for the running kernel: not installed, or
        │                       depmod has not indexed it
        ├── ModuleLoadFailed    the module exists but the kernel refused it ("could not insert")
        ├── ModuleUnloadFailed  rmmod failed for another reason than use (a built-in module)
        ├── DepmodFailed        depmod could not index a kernel release's modules
        ├── KernelToolMissing   modprobe, rmmod, depmod or chroot is not installed
        └── KernelToolTimedOut  a tool ran past its timeout and was killed

Raised by the readers (`pci`, `system`, `modules`, `nvidia`) and by both `KernelOps`
implementations; the driver-manager maps them to its failure reasons. `ModuleInUse` and
`KernelToolTimedOut` may clear up on their own (holders go away, a slow load finishes);
the others need something changed on the host before a retry can help.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


class HostError(Exception):
    """A failure reading or changing the node's host."""


class HostReadError(HostError):
    """A file under the host root exists but cannot be read or does not parse."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class KernelError(HostError):
    """A kernel module operation failed."""


class ModuleInUse(KernelError):
    """The module cannot be unloaded: `holders` (dependent modules first, then other holders
    such as open NVML handles, when known) keep it in use."""

    def __init__(self, module: str, holders: Iterable[str] = ()) -> None:
        self.module = module
        self.holders = tuple(holders)
        by = f" by: {' '.join(self.holders)}" if self.holders else ""
        super().__init__(f"module {module} is in use{by}")


class ModuleNotLoaded(KernelError):
    """The module is not loaded."""

    def __init__(self, module: str) -> None:
        super().__init__(f"module {module} is not loaded")
        self.module = module


class ModuleNotFound(KernelError):
    """No module of that name is installed and indexed for the running kernel."""

    def __init__(self, module: str, kernel_release: str | None) -> None:
        where = f"kernel {kernel_release}" if kernel_release else "the running kernel"
        super().__init__(f"module {module} not found for {where}")
        self.module = module
        self.kernel_release = kernel_release


class ModuleLoadFailed(KernelError):
    """The kernel refused to load the module; `message` is the tool's reason."""

    def __init__(self, module: str, message: str) -> None:
        super().__init__(f"loading module {module} failed: {message}")
        self.module = module
        self.message = message


class ModuleUnloadFailed(KernelError):
    """The module could not be unloaded for a reason other than use."""

    def __init__(self, module: str, message: str) -> None:
        super().__init__(f"unloading module {module} failed: {message}")
        self.module = module
        self.message = message


class DepmodFailed(KernelError):
    """depmod could not write the module index of `kernel_release`."""

    def __init__(self, kernel_release: str, message: str) -> None:
        super().__init__(f"depmod {kernel_release} failed: {message}")
        self.kernel_release = kernel_release
        self.message = message


class KernelToolMissing(KernelError):
    """A tool needed for module operations is not installed (on the host, under chroot)."""

    def __init__(self, tool: str) -> None:
        super().__init__(f"{tool} is not installed")
        self.tool = tool


class KernelToolTimedOut(KernelError):
    """A tool did not finish within `timeout` seconds and was killed."""

    def __init__(self, command: tuple[str, ...], timeout: float) -> None:
        super().__init__(f"{' '.join(command)} did not finish within {timeout:g} s")
        self.command = command
        self.timeout = timeout
