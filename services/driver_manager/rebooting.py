"""Rebooting the node: through the host's systemd on a real node, `SimKernel.reboot` on a
simulated one.

`executor.Executor` calls `reboot` for a `RebootNode` command after it checked the boot id
guard and published `RebootStarted`. Which rebooter runs follows the configured kernel mode
(`config.KernelMode`): `host` reboots the machine, `simulated` and `standins` (both only
ever act on a simulated host root) reboot the simulation, so no test can reboot the machine
it runs on.

- `HostRebooter` runs `chroot <host root> systemctl reboot`: systemd stops every service,
  this agent included, and the orchestrator sees the reboot through discovery's new boot
  id. A failure to start it raises `RebootFailed`; the command is then retried.
- `SimRebooter` ends every module and hold, writes a new boot id, and loads again the
  modules that were loaded before (as a host that loads its drivers at boot would), each at
  the active version. The agent keeps running, as the next boot's agent would.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from gpuop.host import components, modules
from gpuop.host.roots import HostRoot
from gpuop.host.simkernel import SimKernel

log = logging.getLogger(__name__)


class RebootFailed(Exception):
    """The reboot could not be started."""


class Rebooter(Protocol):
    async def reboot(self) -> None:
        """Start the reboot; on a real node, this process dies soon after."""
        ...


class HostRebooter:
    """Reboots the real host through its systemd."""

    def __init__(self, root: HostRoot, timeout: float = 60.0) -> None:
        self.root = root
        self.timeout = timeout

    @property
    def command(self) -> tuple[str, ...]:
        return ("chroot", str(self.root.path), "systemctl", "reboot")

    async def reboot(self) -> None:
        log.warning("rebooting the node: %s", " ".join(self.command))
        try:
            process = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
            )
        except OSError as exc:
            raise RebootFailed(f"{' '.join(self.command)}: {exc}") from None
        try:
            output, _ = await asyncio.wait_for(process.communicate(), self.timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise RebootFailed(f"{' '.join(self.command)} did not return") from None
        if process.returncode != 0:
            text = output.decode(errors="replace").strip()
            raise RebootFailed(f"{' '.join(self.command)} failed ({process.returncode}): {text}")


class SimRebooter:
    """Reboots a simulated node whose `/` is the host root."""

    def __init__(self, root: HostRoot) -> None:
        self.kernel = SimKernel(root)

    async def reboot(self) -> None:
        running = {module.name for module in modules.loaded_modules(self.kernel.root)}
        managed = [m for c in components.MODULES for m in components.modules_of(c)]
        again = components.load_order(m for m in managed if m in running)
        boot_id = await asyncio.to_thread(self.kernel.reboot, load=again)
        log.info("simulated reboot done: boot id %s, loaded %s", boot_id, " ".join(again))
