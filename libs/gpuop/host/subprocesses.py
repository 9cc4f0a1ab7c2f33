"""Kernel module operations on a real host: `modprobe`, `rmmod` and `depmod` run chrooted
into the host root, their failures read from what they print.

The driver-manager uses `SubprocessKernelOps` on a node (its pod mounts the host's `/` at
`/host` and may chroot). With `chroot=False` the tools come from PATH and learn the host
root from `GPUOP_HOST_ROOT`: that is how tests and the demo run the stand-ins of
`gpuop_sim.host.standins` against a simulated host, through this same code.

kmod's messages, which `failure` maps to `gpuop.host.errors`:

    rmmod: ERROR: Module nvidia is in use by: nvidia_uvm nvidia_modeset   ModuleInUse(holders)
    rmmod: ERROR: Module nvidia is in use                                  ModuleInUse
    modprobe: FATAL: Module nvidia is in use.                              ModuleInUse
    rmmod: ERROR: Module nvidia is not currently loaded                    (unload: done)
    modprobe: FATAL: Module nvidia not found in directory /lib/modules/R   ModuleNotFound
    modprobe: ERROR: could not insert 'nvidia': No such device             ModuleLoadFailed
    rmmod: ERROR: Module mlx5_core is builtin.                             ModuleUnloadFailed
    chroot: failed to run command 'modprobe': No such file or directory    KernelToolMissing
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import Mapping
from contextlib import suppress

from gpuop import moduleparams
from gpuop.host import modules
from gpuop.host.errors import (
    DepmodFailed,
    KernelError,
    KernelToolMissing,
    KernelToolTimedOut,
    ModuleInUse,
    ModuleLoadFailed,
    ModuleNotFound,
    ModuleNotLoaded,
    ModuleUnloadFailed,
)
from gpuop.host.modules import LoadedModule
from gpuop.host.roots import HostRoot

HOST_ROOT_ENV = "GPUOP_HOST_ROOT"
"""Tells a tool run without chroot which directory is the host's `/`."""
HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
"""PATH inside the chroot: where distributions put kmod's tools."""

_IN_USE_BY = re.compile(r"Module (?P<module>\S+) is in use by:(?P<holders>.*)$", re.MULTILINE)
_IN_USE = re.compile(r"Module (?P<module>\S+) is in use\b")
_NOT_FOUND = re.compile(r"Module (?P<module>\S+) not found in directory /lib/modules/(?P<kr>\S+)")
_NOT_LOADED = re.compile(r"Module (?P<module>\S+) is not (?:currently loaded|in kernel)")
_NOT_INSERTED = re.compile(r"could not insert '(?P<module>[^']+)': (?P<reason>.+)$", re.MULTILINE)
_NO_COMMAND = re.compile(r"chroot: failed to run command '(?P<tool>[^']+)'")


class SubprocessKernelOps:
    """`KernelOps` through kmod's tools on the host at `root`."""

    def __init__(self, root: HostRoot, *, chroot: bool = True, timeout: float = 300.0) -> None:
        self.root = root
        self.chroot = chroot
        self.timeout = timeout

    async def loaded(self) -> tuple[LoadedModule, ...]:
        return modules.loaded_modules(self.root)

    async def load(self, module: str, options: Mapping[str, str] | None = None) -> None:
        returncode, output = await self._run("modprobe", module, *moduleparams.words(options or {}))
        if returncode != 0:
            raise failure("modprobe", module, output) or ModuleLoadFailed(module, output)

    async def unload(self, module: str) -> None:
        returncode, output = await self._run("rmmod", module)
        if returncode == 0:
            return
        error = failure("rmmod", module, output) or ModuleUnloadFailed(module, output)
        if not isinstance(error, ModuleNotLoaded):
            raise error

    async def depmod(self, kernel_release: str) -> None:
        returncode, output = await self._run("depmod", "-a", kernel_release)
        if returncode != 0:
            error = failure("depmod", kernel_release, output)
            if isinstance(error, KernelToolMissing):
                raise error
            raise DepmodFailed(kernel_release, output)

    async def _run(self, tool: str, *arguments: str) -> tuple[int, str]:
        """Run `tool`; its exit status and its stderr and stdout, stripped."""
        command = (tool, *arguments)
        if self.chroot:
            command = ("chroot", str(self.root.path), *command)
        try:
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._environment(),
                start_new_session=True,
            )
        except FileNotFoundError:
            raise KernelToolMissing(command[0]) from None
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), self.timeout)
        except TimeoutError:
            _kill_group(process.pid)
            await process.wait()
            raise KernelToolTimedOut(command, self.timeout) from None
        except BaseException:
            _kill_group(process.pid)
            await process.wait()
            raise
        output = "\n".join(
            text
            for text in (stderr.decode(errors="replace"), stdout.decode(errors="replace"))
            if text.strip()
        ).strip()
        return process.returncode or 0, output

    def _environment(self) -> Mapping[str, str]:
        # LC_ALL=C: chroot's own messages are translated, and `failure` reads them
        if self.chroot:
            return {"PATH": HOST_PATH, "LC_ALL": "C"}
        return {**os.environ, "LC_ALL": "C", HOST_ROOT_ENV: str(self.root.path)}


def failure(tool: str, subject: str, output: str) -> KernelError | None:
    """The error a failed `tool` run about `subject` (a module, or depmod's kernel release)
    reports in `output`; None when the output says nothing this module knows."""
    if match := _NO_COMMAND.search(output):
        return KernelToolMissing(match["tool"])
    if match := _IN_USE_BY.search(output):
        return ModuleInUse(match["module"], match["holders"].split())
    if match := _IN_USE.search(output):
        return ModuleInUse(match["module"])
    if match := _NOT_LOADED.search(output):
        return ModuleNotLoaded(match["module"])
    if match := _NOT_FOUND.search(output):
        return ModuleNotFound(match["module"], match["kr"])
    if match := _NOT_INSERTED.search(output):
        return ModuleLoadFailed(match["module"], match["reason"].strip())
    if tool == "rmmod" and "is builtin" in output:
        return ModuleUnloadFailed(subject, output)
    return None


def _kill_group(pid: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
