"""Applying a runtime plan (`gpuop.host.runtimes`) to a running node: write the drop-in,
restart the container runtime, and confirm it answers on its socket again within a
deadline; if it does not, put the earlier files back, restart again, and fail with the
reason.

Called by the driver-manager's runtime-configure step inside the saga's maintenance window
(the node cordoned and drained, so the restart is under no running pod) and by
`gpuop runtime configure` without `--no-restart`. A plan with nothing to change is a no-op:
no write, no restart.

The restart goes through one `RuntimeService` protocol: `SystemdRuntimeService` restarts the
host's unit (`chroot <host root> systemctl restart containerd`) and connects to its socket
under the host root; the simulated host brings its own.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass
from typing import Protocol

from gpuop.clocks import Clock
from gpuop.host import runtimes
from gpuop.host.errors import HostError
from gpuop.host.roots import HostRoot
from gpuop.host.runtimes import Runtime, RuntimePlan

log = logging.getLogger(__name__)

SOCKETS = {
    Runtime.CONTAINERD: "run/containerd/containerd.sock",
    Runtime.CRIO: "var/run/crio/crio.sock",
}
"""Where each runtime answers, under the host root."""
UNITS = {Runtime.CONTAINERD: "containerd", Runtime.CRIO: "crio"}
"""Each runtime's systemd unit."""
POLL_SECONDS = 0.5


class RuntimeRestartFailed(HostError):
    """The runtime could not be restarted, or did not answer again in time
    (`not_answering`). `restored` says whether the earlier configuration was put back and
    the runtime answered with it."""

    def __init__(self, reason: str, *, restored: bool, not_answering: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.restored = restored
        self.not_answering = not_answering


class RuntimeService(Protocol):
    """Restarts a node's container runtime and says whether it answers."""

    async def restart(self, runtime: Runtime) -> None:
        """Restart `runtime`; raise `RuntimeRestartFailed` when it cannot be started."""

    async def answering(self, runtime: Runtime) -> bool:
        """Whether `runtime` accepts a connection on its socket now."""


@dataclass(frozen=True)
class Applied:
    """What `configure` did."""

    changed: bool
    """Whether files were written and the runtime restarted."""
    waited_seconds: float = 0.0
    """How long the runtime took to answer again."""


async def configure(
    root: HostRoot,
    planned: RuntimePlan,
    service: RuntimeService,
    clock: Clock,
    deadline_seconds: float,
) -> Applied:
    """Apply `planned`, restart the runtime and wait for it to answer; undo on failure.

    Raises `RuntimeRestartFailed` with the reason when the runtime did not come back; the
    earlier files are back then, and the runtime was restarted with them."""
    if not planned.changed:
        return Applied(changed=False)
    runtimes.apply(root, planned)
    try:
        await service.restart(planned.runtime)
        waited = await _wait_answering(service, planned.runtime, clock, deadline_seconds)
    except RuntimeRestartFailed as failure:
        reason, not_answering = failure.reason, False
    else:
        if waited is not None:
            return Applied(changed=True, waited_seconds=waited)
        reason = f"{planned.runtime} did not answer within {deadline_seconds:g} s of its restart"
        not_answering = True
    log.warning("%s; restoring the earlier configuration", reason)
    runtimes.undo(root, planned)
    restored = True
    try:
        await service.restart(planned.runtime)
        back = await _wait_answering(service, planned.runtime, clock, deadline_seconds)
        restored = back is not None
    except RuntimeRestartFailed as again:
        log.error("restarting %s with its earlier configuration failed: %s", planned.runtime, again)
        restored = False
    suffix = (
        "earlier configuration restored"
        if restored
        else ("earlier configuration written back, but the runtime does not answer with it either")
    )
    raise RuntimeRestartFailed(
        f"{reason}; {suffix}", restored=restored, not_answering=not_answering
    )


async def _wait_answering(
    service: RuntimeService, runtime: Runtime, clock: Clock, deadline_seconds: float
) -> float | None:
    """Seconds until `runtime` answered; None when the deadline passed first."""
    start = clock.monotonic()
    while True:
        if await service.answering(runtime):
            return clock.monotonic() - start
        if clock.monotonic() - start >= deadline_seconds:
            return None
        await clock.sleep(POLL_SECONDS)


class SystemdRuntimeService:
    """The real node's runtime: its systemd unit and its socket under the host root."""

    def __init__(self, root: HostRoot, timeout: float = 120.0) -> None:
        self.root = root
        self.timeout = timeout

    def command(self, runtime: Runtime) -> tuple[str, ...]:
        return ("chroot", str(self.root.path), "systemctl", "restart", UNITS[runtime])

    async def restart(self, runtime: Runtime) -> None:
        command = self.command(runtime)
        log.warning("restarting the container runtime: %s", " ".join(command))
        try:
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
            )
        except OSError as error:
            raise RuntimeRestartFailed(f"{' '.join(command)}: {error}", restored=False) from None
        try:
            output, _ = await asyncio.wait_for(process.communicate(), self.timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise RuntimeRestartFailed(
                f"{' '.join(command)} did not return in {self.timeout:g} s", restored=False
            ) from None
        if process.returncode != 0:
            text = output.decode(errors="replace").strip()
            raise RuntimeRestartFailed(
                f"{' '.join(command)} failed ({process.returncode}): {text}", restored=False
            )

    async def answering(self, runtime: Runtime) -> bool:
        return await asyncio.to_thread(socket_answers, str(self.root.join(SOCKETS[runtime])))


def socket_answers(path: str, timeout: float = 1.0) -> bool:
    """Whether a unix socket at `path` accepts a connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(timeout)
        try:
            client.connect(path)
        except OSError:
            return False
    return True
