"""Every error `gpuop.nvml` raises, mapped from NVML's return codes in one place.

    NvmlError                   an NVML query failed; `code` is NVML's return code when known
    ├── DriverUnavailable       NVML cannot start on this host
    │   ├── DriverNotLoaded     the `nvidia` kernel module is not loaded
    │   ├── LibraryNotFound     `libnvidia-ml.so.1` is not installed or not mounted
    │   └── DriverMismatch      the library and the loaded kernel module differ in version
    │                           (typical right after a driver install, before the reload)
    ├── NotInitialized          a query outside an open session (`init()` not called)
    ├── NotSupported            this GPU or driver cannot answer the query: "metric absent"
    │                           (also a versioned query the driver predates)
    │   └── FunctionNotFound    the installed library predates the query
    ├── NoPermission            the caller may not make the query
    ├── InvalidArgument         a bad argument, such as a GPU index past the device count
    ├── InUse                   processes or instances hold what was to change (MIG mode)
    ├── InsufficientResources   a MIG instance does not fit beside the others
    ├── NotFound                the object asked for does not exist (an empty MIG slot)
    ├── GpuFailure              the GPU itself is unusable until something is done
    │   ├── GpuLost             it fell off the bus or stopped answering (XID 79 and kin)
    │   └── GpuResetRequired    it needs a reset or a reboot
    └── NvmlTimeout             an event wait or a query ran out of time

`error_for_code()` is the one place a numeric NVML return code becomes one of these; the
pynvml binding (`binding.py`) calls it for every `pynvml.NVMLError`, so raw pynvml exceptions
never leave `gpuop.nvml`. Backends return `None` for a field whose query is `NotSupported`
rather than raising, so callers see this tree only for real failures.

Two errors stand apart, being about configuration rather than NVML: `InvalidBackendSpec` (a
`--nvml` value `backends.open_backend()` cannot use; a `ValueError`), and `ModuleInUse`,
which the in-memory module state (`gpuop_sim.nvml.modules.InMemoryModules`) raises when a
test unloads a module something still holds, the way `rmmod` refuses.
"""

from __future__ import annotations


class NvmlError(Exception):
    """An NVML query failed."""

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        """NVML's return code (`NVML_ERROR_*`), when the error came from NVML."""


class DriverUnavailable(NvmlError):
    """NVML cannot be used on this host right now."""


class DriverNotLoaded(DriverUnavailable):
    """The NVIDIA kernel module is not loaded."""


class LibraryNotFound(DriverUnavailable):
    """The NVML shared library is missing."""


class DriverMismatch(DriverUnavailable):
    """The NVML library and the loaded kernel module are different driver versions."""


class NotInitialized(NvmlError):
    """A query was made outside an open NVML session."""


class NotSupported(NvmlError):
    """The GPU or driver does not support the query; treat the value as absent."""


class FunctionNotFound(NotSupported):
    """The installed NVML library does not have the function."""


class NoPermission(NvmlError):
    """The caller lacks the permission the query needs."""


class InvalidArgument(NvmlError):
    """An argument NVML refuses, such as an index past the device count."""


class InUse(NvmlError):
    """What was to change is in use: processes on the GPU, instances still on it."""


class InsufficientResources(NvmlError):
    """Not enough left on the GPU: a MIG instance overlaps or outnumbers the others."""


class NotFound(NvmlError):
    """The requested object does not exist."""


class GpuFailure(NvmlError):
    """The GPU is unusable until it is reset or the node rebooted."""


class GpuLost(GpuFailure):
    """The GPU stopped answering."""


class GpuResetRequired(GpuFailure):
    """The GPU needs a reset before it can be used again."""


class NvmlTimeout(NvmlError):
    """A wait or query ran out of time."""


class InvalidBackendSpec(ValueError):
    """A `--nvml` value that names no usable backend; the message says what is accepted."""


class ModuleInUse(Exception):
    """An in-memory kernel module cannot be unloaded: something holds it."""

    def __init__(self, module: str, holders: frozenset[str]) -> None:
        super().__init__(f"module {module} is in use by {', '.join(sorted(holders))}")
        self.module = module
        self.holders = holders


# NVML return codes (nvml.h `nvmlReturn_t`), kept here so this module needs no pynvml.
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_RESET_REQUIRED = 16
ERROR_LIB_RM_VERSION_MISMATCH = 18
ERROR_IN_USE = 19
ERROR_INSUFFICIENT_RESOURCES = 23
ERROR_ARGUMENT_VERSION_MISMATCH = 25

_BY_CODE: dict[int, type[NvmlError]] = {
    ERROR_UNINITIALIZED: NotInitialized,
    ERROR_INVALID_ARGUMENT: InvalidArgument,
    ERROR_NOT_SUPPORTED: NotSupported,
    ERROR_NO_PERMISSION: NoPermission,
    ERROR_NOT_FOUND: NotFound,
    ERROR_DRIVER_NOT_LOADED: DriverNotLoaded,
    ERROR_TIMEOUT: NvmlTimeout,
    ERROR_LIBRARY_NOT_FOUND: LibraryNotFound,
    ERROR_FUNCTION_NOT_FOUND: FunctionNotFound,
    ERROR_GPU_IS_LOST: GpuLost,
    ERROR_RESET_REQUIRED: GpuResetRequired,
    ERROR_LIB_RM_VERSION_MISMATCH: DriverMismatch,
    ERROR_IN_USE: InUse,
    ERROR_INSUFFICIENT_RESOURCES: InsufficientResources,
    # a versioned query (memory info v2) this driver predates
    ERROR_ARGUMENT_VERSION_MISMATCH: NotSupported,
}


def error_for_code(code: int, message: str) -> NvmlError:
    """The typed error for an NVML return code; unknown codes give a plain `NvmlError`."""
    return _BY_CODE.get(code, NvmlError)(message, code=code)
