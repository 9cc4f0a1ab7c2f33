"""The node's MPS control daemons: `nvidia-cuda-mps-control` from the GPU driver's user-space
tools, run with the limits `mps.MpsDaemon` names and kept running.

`MpsControl` runs the program the host has (`locate`: `/usr/sbin`, `/usr/bin`, `/sbin`,
`/bin` under the host root), as upstream's mps-control-daemon does:

    start   its pipe, log and shm directories made; `nvidia-cuda-mps-control -d` with
            CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY; then each limit command
            written to a front-end's stdin (`echo <command> | nvidia-cuda-mps-control`).
            A daemon already answering there (left by a plugin that was killed) is told to
            quit first, so the limits in force are always the config's.
    check   `get_default_active_thread_percentage` answered (upstream's health check)
    stop    `quit`

On a real node it runs chrooted into the host root (as the driver-manager runs kmod's tools)
with the directories as the host names them; on a simulated node (`chroot=False`) the
stand-in `gpuop_sim.host.mpscontrol` installs in the host root is run as it is, with the
directories under the host root. A host without the program is an `MpsProgramMissing` that
says what to install.

`MpsSupervisor` keeps the daemons the plan of the config in force needs (`apply`, called by
`plugins.DevicePlugins` with its lock held): it quits those no longer needed or changed and
starts the new ones; `check` (the plugins' loop calls it every `check_interval`, with the
same lock) asks each running daemon, marks one
that does not answer (killed, crashed) failed, and starts a failed one again once its
backoff (`backoff_initial` doubling up to `backoff_max`, reset once it answered a check)
has passed. Every change of a daemon's state is added to `changes` as a
`device.MpsDaemonChanged` for the agent to publish, in order. A pause of the GPU driver applies no
daemon at all: each quits before NVML is closed, and the resume starts them again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import tempfile
from collections import deque
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass

from gpuop.events import device
from gpuop.events.device import MpsDaemonState
from gpuop.host.roots import HostRoot
from gpuop.host.subprocesses import HOST_PATH
from gpuop.services.device_plugin.errors import MpsError, MpsProgramMissing
from gpuop.services.device_plugin.mps import MpsDaemon

log = logging.getLogger(__name__)

PROGRAM = "nvidia-cuda-mps-control"
"""The MPS control daemon and its front-end, from the NVIDIA driver's user-space tools."""
HEALTH_COMMAND = "get_default_active_thread_percentage"
"""What a daemon is asked to tell whether it is alive (upstream's check)."""
QUIT_COMMAND = "quit"
INSTALL_HINT = (
    "install the NVIDIA driver's user-space tools on the host (the package holding"
    f" {PROGRAM}: nvidia-compute-utils-<branch> on Ubuntu, nvidia-driver-cuda on RHEL), or"
    " share the GPUs without MPS"
)
CHECK_INTERVAL = 5.0
"""Seconds between health checks of the running daemons."""
BACKOFF_INITIAL = 1.0
"""Seconds before a failed daemon is started again; doubled with each failure in a row."""
BACKOFF_MAX = 60.0
"""The longest wait before a failed daemon is started again."""
COMMAND_TIMEOUT = 30.0
"""Seconds one run of the program may take."""
QUIT_CHECKS = 50
QUIT_CHECK_INTERVAL = 0.1
"""How often, and how many times, a daemon told to quit is asked whether it is gone."""


class MpsControl:
    """Runs `nvidia-cuda-mps-control` of the host at `root`."""

    def __init__(
        self, root: HostRoot, *, chroot: bool = True, timeout: float = COMMAND_TIMEOUT
    ) -> None:
        self.root = root
        self.chroot = chroot
        self.timeout = timeout

    def locate(self) -> str:
        """The program's path on the host; `MpsProgramMissing` when it has none."""
        places = [f"{directory}/{PROGRAM}" for directory in HOST_PATH.split(":")]
        for place in places:
            path = self.root.resolve(place)
            if path.is_file() and os.access(path, os.X_OK):
                return place
        raise MpsProgramMissing(
            f"{PROGRAM} is not on the host (looked in {', '.join(places)}): {INSTALL_HINT}"
        )

    async def start(self, daemon: MpsDaemon) -> None:
        """Start `daemon` and set its limits; raises `MpsError`."""
        program = self.locate()
        for directory in (daemon.pipe_dir, daemon.log_dir, daemon.shm_dir):
            try:
                self.root.join(directory).mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise MpsError(f"cannot make {directory}: {error}") from error
        if await self.answers(daemon):
            log.info("an MPS daemon for %s runs already: quitting it first", daemon.resource)
            await self.quit(daemon)
            for _ in range(QUIT_CHECKS):
                if not await self.answers(daemon):
                    break
                await asyncio.sleep(QUIT_CHECK_INTERVAL)
        returncode, output = await self._run(program, daemon, "-d", detached=True)
        if returncode != 0:
            raise MpsError(
                f"{PROGRAM} -d for {daemon.resource} exited with {returncode}:"
                f" {output or 'no output'} (its log: {daemon.log_dir})"
            )
        for command in daemon.limit_commands:
            await self.send(daemon, command)

    async def send(self, daemon: MpsDaemon, command: str) -> str:
        """Write `command` to `daemon`'s control pipe; its answer. Raises `MpsError`."""
        returncode, output = await self._run(self.locate(), daemon, stdin=f"{command}\n")
        if returncode != 0:
            raise MpsError(
                f"{command!r} to the MPS daemon of {daemon.resource} failed ({returncode}):"
                f" {output or 'no output'}"
            )
        return output

    async def answers(self, daemon: MpsDaemon) -> bool:
        """Whether `daemon` runs and answers."""
        try:
            await self.send(daemon, HEALTH_COMMAND)
        except MpsError:
            return False
        return True

    async def quit(self, daemon: MpsDaemon) -> None:
        """Tell `daemon` to quit; raises `MpsError` when it does not answer."""
        await self.send(daemon, QUIT_COMMAND)

    async def _run(
        self,
        program: str,
        daemon: MpsDaemon,
        *arguments: str,
        stdin: str = "",
        detached: bool = False,
    ) -> tuple[int, str]:
        """Run the program for `daemon`; its exit status and output. `detached`: it leaves a
        daemon behind, which keeps any pipe open, so its output goes through a file."""
        if self.chroot:
            command = ("chroot", str(self.root.path), program, *arguments)
        else:
            command = (str(self.root.join(program)), *arguments)
        with tempfile.TemporaryFile() as output:
            try:
                process = await asyncio.create_subprocess_exec(
                    *command,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=output if detached else asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    env=self._environment(daemon),
                    start_new_session=True,
                )
            except OSError as error:
                raise MpsError(f"cannot run {program}: {error}") from error
            try:
                stdout, _ = await asyncio.wait_for(
                    process.communicate(stdin.encode()), self.timeout
                )
            except TimeoutError:
                _kill_group(process.pid)
                await process.wait()
                raise MpsError(
                    f"{program} {' '.join(arguments)} took over {self.timeout} s"
                ) from None
            except BaseException:
                _kill_group(process.pid)
                await process.wait()
                raise
            if detached:
                output.seek(0)
                stdout = output.read()
        return process.returncode or 0, (stdout or b"").decode(errors="replace").strip()

    def _environment(self, daemon: MpsDaemon) -> Mapping[str, str]:
        if self.chroot:
            return {"PATH": HOST_PATH, "LC_ALL": "C", **daemon.environment}
        inside = {name: str(self.root.join(path)) for name, path in daemon.environment.items()}
        return {**os.environ, "LC_ALL": "C", **inside}


@dataclass
class _Tracked:
    """One daemon the plan needs, and where it stands."""

    daemon: MpsDaemon
    state: MpsDaemonState = MpsDaemonState.STOPPED
    message: str = ""
    restarts: int = 0
    failures: int = 0
    """Failures in a row: the backoff's exponent."""
    retry_at: float = 0.0
    """Loop time from which a failed daemon is started again."""


class MpsSupervisor:
    """Keeps the MPS control daemons the config in force needs running."""

    def __init__(
        self,
        control: MpsControl,
        *,
        check_interval: float = CHECK_INTERVAL,
        backoff_initial: float = BACKOFF_INITIAL,
        backoff_max: float = BACKOFF_MAX,
    ) -> None:
        self.control = control
        self.check_interval = check_interval
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._tracked: dict[str, _Tracked] = {}
        self.changes: deque[device.MpsDaemonChanged] = deque()
        """Every change of a daemon's state not yet on the bus, oldest first."""
        self.changed = asyncio.Event()
        """Set when a change is added to `changes`."""

    @property
    def daemons(self) -> tuple[MpsDaemon, ...]:
        """The daemons it keeps."""
        return tuple(tracked.daemon for tracked in self._tracked.values())

    def running(self, resource: str) -> bool:
        """Whether the daemon of `resource` runs."""
        tracked = self._tracked.get(resource)
        return tracked is not None and tracked.state is MpsDaemonState.RUNNING

    @property
    def problem(self) -> str | None:
        """Why a daemon it keeps does not run, if one does not."""
        failed = [t for t in self._tracked.values() if t.state is MpsDaemonState.FAILED]
        if not failed:
            return None
        return "; ".join(f"MPS daemon of {t.daemon.resource}: {t.message}" for t in failed)

    async def apply(self, wanted: Sequence[MpsDaemon], reason: str) -> bool:
        """Run exactly the daemons `wanted`: quit the others (and those whose limits
        changed), start the new ones. `reason` says why for the daemons it quits. Returns
        whether any daemon changed state."""
        by_resource = {daemon.resource: daemon for daemon in wanted}
        changed = False
        for resource, tracked in list(self._tracked.items()):
            if by_resource.get(resource) == tracked.daemon:
                continue
            del self._tracked[resource]
            changed = await self._stop(tracked, reason) or changed
        for daemon in wanted:
            if daemon.resource not in self._tracked:
                tracked = _Tracked(daemon)
                self._tracked[daemon.resource] = tracked
                await self._start(tracked)
                changed = True
        return changed

    async def check(self) -> bool:
        """Ask every running daemon; start failed ones whose backoff has passed. Returns
        whether any daemon changed state."""
        changed = False
        now = asyncio.get_running_loop().time()
        for tracked in list(self._tracked.values()):
            if tracked.state is MpsDaemonState.RUNNING:
                if await self.control.answers(tracked.daemon):
                    tracked.failures = 0
                    continue
                self._fail(tracked, "it stopped answering on its control pipe (killed or crashed)")
                changed = True
            elif tracked.state is MpsDaemonState.FAILED and now >= tracked.retry_at:
                changed = await self._start(tracked, again=True) or changed
        return changed

    async def _start(self, tracked: _Tracked, *, again: bool = False) -> bool:
        daemon = tracked.daemon
        try:
            await self.control.start(daemon)
        except MpsError as error:
            message = str(error)
            if tracked.state is MpsDaemonState.FAILED and tracked.message == message:
                self._backoff(tracked)
                log.warning("MPS daemon of %s still fails: %s", daemon.resource, message)
                return False
            self._fail(tracked, message)
            return True
        if again:
            tracked.restarts += 1
        tracked.state, tracked.message = MpsDaemonState.RUNNING, ""
        log.info(
            "MPS daemon of %s runs: %d GPUs, %d clients each, %s",
            daemon.resource,
            len(daemon.gpus),
            daemon.replicas,
            ", ".join(daemon.limit_commands),
        )
        self._report(tracked)
        return True

    async def _stop(self, tracked: _Tracked, reason: str) -> bool:
        if tracked.state is not MpsDaemonState.RUNNING:
            if tracked.state is MpsDaemonState.STOPPED:
                return False
            tracked.state, tracked.message = MpsDaemonState.STOPPED, reason
            self._report(tracked)
            return True
        try:
            await self.control.quit(tracked.daemon)
        except MpsError as error:
            log.warning("MPS daemon of %s did not quit: %s", tracked.daemon.resource, error)
        tracked.state, tracked.message = MpsDaemonState.STOPPED, reason
        log.info("MPS daemon of %s quit: %s", tracked.daemon.resource, reason)
        self._report(tracked)
        return True

    def _fail(self, tracked: _Tracked, message: str) -> None:
        tracked.state, tracked.message = MpsDaemonState.FAILED, message
        self._backoff(tracked)
        log.error("MPS daemon of %s failed: %s", tracked.daemon.resource, message)
        self._report(tracked)

    def _backoff(self, tracked: _Tracked) -> None:
        delay = min(self._backoff_max, self._backoff_initial * 2**tracked.failures)
        tracked.failures += 1
        tracked.retry_at = asyncio.get_running_loop().time() + delay

    def _report(self, tracked: _Tracked) -> None:
        daemon = tracked.daemon
        self.changed.set()
        self.changes.append(
            device.MpsDaemonChanged(
                resource=daemon.resource,
                state=tracked.state,
                replicas=daemon.replicas,
                gpus=len(daemon.gpus),
                restarts=tracked.restarts,
                message=tracked.message[:2048],
            )
        )


def _kill_group(pid: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
