"""Rebooting the node: through the host's systemd on a real node, through the simulated
host's plugin on a simulated one (`gpuop_sim.host.plugin.SimRebooter`).

`executor.Executor` calls `reboot` for a `RebootNode` command after it checked the boot id
guard and published `RebootStarted`. Which rebooter runs follows the configured kernel mode
(`config.KernelMode`): `host` reboots the machine, `simulated` and `standins` (both only
ever act on a simulated host root) reboot the simulation, so no test can reboot the machine
it runs on.

- `HostRebooter` runs `chroot <host root> systemctl reboot`: systemd stops every service,
  this agent included, and the orchestrator sees the reboot through discovery's new boot
  id. A failure to start it raises `RebootFailed`; the command is then retried.
- the simulated host's rebooter (entry point `gpuop.kernels:simulated`) reboots the
  simulation; the agent keeps running, as the next boot's agent would.
"""

from __future__ import annotations

import asyncio
import logging

from gpuop.host.roots import HostRoot

log = logging.getLogger(__name__)


class RebootFailed(Exception):
    """The reboot could not be started."""


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
