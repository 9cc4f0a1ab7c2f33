"""Stand-in `modprobe`, `rmmod` and `depmod` executables that act on a simulated host.

Tests and the demo call `install_tools(bin_dir)`, put `bin_dir` first on PATH and use
`SubprocessKernelOps(root, chroot=False)`: the real subprocess path then runs these tools,
which take the host root from `GPUOP_HOST_ROOT`, do the work through `SimKernel`, and on
failure print kmod's own messages with its exit status 1, so the parsing in
`gpuop.host.subprocesses` is exercised end to end. Each tool is a three-line script
running `run_tool` with this interpreter.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from gpuop import moduleparams
from gpuop.host.errors import (
    DepmodFailed,
    HostError,
    ModuleInUse,
    ModuleLoadFailed,
    ModuleNotFound,
    ModuleNotLoaded,
    ModuleUnloadFailed,
)
from gpuop.host.roots import HostRoot
from gpuop.host.subprocesses import HOST_ROOT_ENV
from gpuop_sim.host.simkernel import SimKernel

TOOLS = ("modprobe", "rmmod", "depmod")

_SCRIPT = """#!{python}
import sys
from gpuop_sim.host import standins
sys.exit(standins.run_tool({tool!r}, sys.argv[1:]))
"""


def install_tools(bin_dir: Path) -> Path:
    """Write the stand-in tools into `bin_dir` (created if missing); returns `bin_dir`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        path = bin_dir / tool
        path.write_text(_SCRIPT.format(python=sys.executable, tool=tool))
        path.chmod(0o755)
    return bin_dir


def run_tool(tool: str, arguments: Sequence[str]) -> int:
    """Run stand-in `tool` with its command-line `arguments`; its exit status."""
    location = os.environ.get(HOST_ROOT_ENV)
    if not location:
        return _fail(f"{tool}: FATAL: {HOST_ROOT_ENV} is not set")
    kernel = SimKernel(HostRoot(Path(location)))
    names = [argument for argument in arguments if not argument.startswith("-")]
    flags = {argument for argument in arguments if argument.startswith("-")}
    tools: dict[str, Callable[[SimKernel, list[str], set[str]], int]] = {
        "modprobe": _modprobe,
        "rmmod": _rmmod,
        "depmod": _depmod,
    }
    try:
        return tools[tool](kernel, names, flags)
    except HostError as error:  # a broken host root: no kmod message fits
        return _fail(f"{tool}: ERROR: {error}")


def _modprobe(kernel: SimKernel, names: list[str], flags: set[str]) -> int:
    if not names:
        return _fail("modprobe: FATAL: Module name not specified")
    if flags & {"-r", "--remove"}:
        for name in names:
            try:
                kernel.rmmod(name)
            except ModuleInUse as error:
                return _fail(f"modprobe: FATAL: Module {error.module} is in use.")
            except ModuleNotLoaded as error:
                return _fail(f"modprobe: FATAL: Module {error.module} is not in kernel.")
            except ModuleUnloadFailed as error:
                return _fail(f"modprobe: FATAL: {error.message}")
        return 0
    try:
        kernel.modprobe(names[0], moduleparams.parsed(names[1:]))  # the rest: its parameters
    except ModuleNotFound as error:
        return _fail(
            f"modprobe: FATAL: Module {error.module} not found in directory "
            f"/lib/modules/{error.kernel_release}"
        )
    except ModuleLoadFailed as error:
        return _fail(f"modprobe: ERROR: could not insert '{error.module}': {error.message}")
    return 0


def _rmmod(kernel: SimKernel, names: list[str], flags: set[str]) -> int:
    if not names:
        return _fail("rmmod: ERROR: missing module name.")
    status = 0
    for name in names:
        try:
            kernel.rmmod(name)
        except ModuleInUse as error:
            users = [holder for holder in error.holders if kernel.is_loaded(holder)]
            if users:
                status = _fail(f"rmmod: ERROR: Module {name} is in use by: {' '.join(users)}")
            else:
                status = _fail(f"rmmod: ERROR: Module {name} is in use")
        except ModuleNotLoaded:
            status = _fail(f"rmmod: ERROR: Module {name} is not currently loaded")
        except ModuleUnloadFailed as error:
            status = _fail(f"rmmod: ERROR: {error.message}")
    return status


def _depmod(kernel: SimKernel, names: list[str], flags: set[str]) -> int:
    try:
        kernel.run_depmod(names[0] if names else None)
    except DepmodFailed as error:
        return _fail(f"depmod: ERROR: {error.message}")
    return 0


def _fail(message: str) -> int:
    print(message, file=sys.stderr)
    return 1
