"""The validation ladder's CUDA rung: can a process create a CUDA context on every GPU?

The driver-manager's validator (`ValidateDriver` with `check: cuda`) calls a `CudaProbe`:
`LibcudaProbe` on a node, which runs `gpuop.host.cudarun` against the installed `libcuda`
in a child process with a timeout (a libcuda that hangs on a wedged GPU must not hang the
agent: the child is killed), or the simulated node's probe (`gpuop_sim`), which answers as
a healthy node does and can be told to fail.

Where the library is: the format 2 user space of the version asked for
(`opt/gpuop/gpu/<version>/lib/libcuda.so.1`), else the distribution's places under the
host root. CUDA's error numbers are named as `cuda.h` names them (`CUDA_ERRORS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpuop.host.roots import HostRoot

CUDA_ERRORS: dict[int, str] = {
    -1: "LIBCUDA_NOT_LOADABLE",
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
    46: "CUDA_ERROR_DEVICES_UNAVAILABLE",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    201: "CUDA_ERROR_INVALID_CONTEXT",
    214: "CUDA_ERROR_ECC_UNCORRECTABLE",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    999: "CUDA_ERROR_UNKNOWN",
}
"""The numbers a probe most likely meets, from `cuda.h`; others print as their number."""
LIBCUDA = "libcuda.so.1"
SYSTEM_LIBRARY_DIRS = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
)
"""Where distributions put `libcuda.so.1`, under the host root."""
USERSPACE_LIBRARIES = "opt/gpuop/gpu/{version}/lib"
"""A format 2 package's user space libraries (`gpuop.services.driver_manager.installing`)."""


def error_name(code: int) -> str:
    """`CUDA_ERROR_NO_DEVICE` for 100; `CUDA error 7` for one the table lacks."""
    return CUDA_ERRORS.get(code, f"CUDA error {code}")


@dataclass(frozen=True)
class CudaReport:
    """How a probe ended."""

    devices: int
    """Devices `cuDeviceGetCount` reported (0 when it was not reached)."""
    error: int = 0
    """0 when every GPU took a context; else the CUDA error of the first call that failed."""
    call: str | None = None
    """That call: `cuInit`, `cuDeviceGetCount`, `cuCtxCreate`, ..., `dlopen`, or `timeout`."""
    detail: str = ""
    """More words: the loader's message, the GPU ordinal, the timeout."""

    @property
    def ok(self) -> bool:
        return self.error == 0 and self.call is None

    def describe(self) -> str:
        """One line for an operator: `cuInit failed: CUDA_ERROR_NO_DEVICE (100)`."""
        if self.ok:
            return f"a CUDA context on each of {self.devices} GPUs"
        if self.call in ("timeout", "crash"):
            return f"the CUDA probe failed: {self.detail}"
        text = f"{self.call} failed: {error_name(self.error)} ({self.error})"
        return f"{text}: {self.detail}" if self.detail else text


class CudaProbe(Protocol):
    """Creates a CUDA context on every GPU of a host."""

    async def probe(self, version: str, timeout_seconds: float) -> CudaReport:
        """Probe the driver `version` (whose libcuda to load) within `timeout_seconds`."""
        ...


def find_libcuda(root: HostRoot, version: str) -> Path | None:
    """The `libcuda.so.1` of driver `version` under `root`, or None."""
    candidates = [USERSPACE_LIBRARIES.format(version=version), *SYSTEM_LIBRARY_DIRS]
    for directory in candidates:
        path = root.resolve(f"{directory}/{LIBCUDA}")
        if path.is_file():
            return path
    return None


class LibcudaProbe:
    """`CudaProbe` with the host's real libcuda, in a child process (`gpuop.host.cudarun`)."""

    def __init__(self, root: HostRoot, library: Path | None = None) -> None:
        self.root = root
        self.library = library
        """The libcuda to load; None: `find_libcuda` for the version probed."""

    async def probe(self, version: str, timeout_seconds: float) -> CudaReport:
        library = self.library or find_libcuda(self.root, version)
        if library is None:
            return CudaReport(0, -1, "dlopen", f"no {LIBCUDA} of driver {version} on the host")
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpuop.host.cudarun", str(library),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own group: the kill takes what it started too
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout_seconds)
        except TimeoutError:
            _kill(process)
            await process.wait()
            detail = f"{library} hung past {timeout_seconds:g} s; killed"
            return CudaReport(0, -1, "timeout", detail)
        return _report(out, err, process.returncode)


def _kill(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _report(out: bytes, err: bytes, returncode: int | None) -> CudaReport:
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        found = json.loads(lines[-1])
        devices, error, call = int(found["devices"]), int(found["error"]), found["call"]
    except (IndexError, ValueError, KeyError, TypeError):
        tail = err.decode(errors="replace").strip()[-400:]
        detail = f"the probe exited {returncode} without a report: {tail}"
        return CudaReport(0, -1, "crash", detail)
    detail = str(found.get("detail", ""))
    if "ordinal" in found:
        detail = f"GPU {found['ordinal']}"
    return CudaReport(devices, error, None if call is None else str(call), detail)
