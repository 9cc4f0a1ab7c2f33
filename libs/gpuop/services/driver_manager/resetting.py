"""The GPU reset on this node: `ResetGpu` in, `GpuReset` or `GpuResetFailed` out.

The remediation saga sends `ResetGpu` once the pods on the GPUs are gone and the operands
paused; `executor.Executor` hands it to `GpuResetter.reset`, which:

1. looks at the GPUs through NVML (a session closed again before anything is reset): each
   named GPU's bus id and minor, its NVLink peers, the processes NVML sees on it;
2. refuses with `in-use` while a process holds a named GPU: one with its
   `/dev/nvidia<minor>` open (`holders.gpu_holders`, as `fuser` finds them, the agent's
   own pid and `nvidia-persistenced` aside) or one NVML lists as computing on it;
3. resets each GPU alone when it can be (`gpuop.host.resets`: the kernel's function reset
   through the host root, NVML having no public reset): the host offers a function reset,
   the GPU answers NVML, and either it resets alone beside running NVLink peers (Ampere
   and later, as `nvidia-smi(1)` says) or none of its peers is in use; then checks through
   a new NVML session that every named GPU answers without an uncorrectable volatile ECC
   error or a pending row remap. Done: `GpuReset(method=nvml)`;
4. otherwise (a GPU that cannot be reset alone, a reset the kernel refused, a GPU still
   failing after it): with `allow_driver_reload`, unloads and loads the GPU driver at the
   version it runs (`reloading.Reloader`, the modules loaded before), which resets every
   GPU of the node and so needs none of them in use, and checks again:
   `GpuReset(method=driver-reload)`; without it, `not-supported` (could not be reset
   alone) or `reset-failed` (tried, and failed);
5. after either, `after_reset` puts back what the reset took (the MIG instances: the
   executor's `mig.MigApplier.reapply`, which also writes the CDI spec); when it cannot, the
   answer is `reset-failed` with its reason.

The command's timeout bounds everything before the unload; a driver once unloaded is always
loaded again, whatever the time, so the node is never left without its driver by a
deadline. A timeout answers `timeout`. The driver running when the command began is its
recorded context (`context`): a run resumed after a crash between the unload and the load
loads it again before anything else.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from gpuop.events import remediation_commands
from gpuop.events.driver import Component
from gpuop.host.resets import FunctionResetFailed, FunctionResets
from gpuop.host.roots import HostRoot
from gpuop.nvml import DeviceInfo, Nvml, NvmlError, opened
from gpuop.nvml.errors import GpuFailure
from gpuop.services.driver_manager import holders
from gpuop.services.driver_manager.reloading import LoadError, Reloader, UnloadError
from gpuop.services.driver_manager.state import StepContext
from gpuop.services.driver_manager.validating import NvmlFactory

log = logging.getLogger(__name__)

RESETS_ALONE_FROM = 8
"""The compute capability (major) from which a GPU resets alone while its NVLink peers run:
Ampere (`nvidia-smi(1)`, `-r`); older GPUs reset together with their peers."""
MAX_MESSAGE = 2048
PERSISTENCE_DAEMON = "nvidia-persist"
"""`nvidia-persistenced` as `/proc/<pid>/comm` shows it (cut to 15 characters)."""

Reason = remediation_commands.ResetFailureReason
Answer = remediation_commands.GpuReset | remediation_commands.GpuResetFailed
AfterReset = Callable[[float], Awaitable[str | None]]
"""Called with the seconds left once the GPUs are back; what it could not put back, or None."""


class ResetRefused(Exception):
    """The reset cannot go on; the answer's reason and message."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Gpu:
    """One GPU of the node as NVML showed it."""

    index: int
    uuid: str
    pci_bus_id: str
    minor: int
    resets_beside_peers: bool
    """It resets alone while its NVLink peers run (Ampere and later)."""
    peers: frozenset[str]
    """UUIDs of the GPUs it reaches over NVLink."""
    computing: tuple[int, ...]
    """Pids NVML lists as running on it."""
    failing: str | None
    """Why NVML cannot query it (fallen off the bus), when it cannot."""


class GpuResetter:
    """Resets GPUs of this host; see the module docstring."""

    def __init__(
        self,
        root: HostRoot,
        reloader: Reloader,
        nvml: NvmlFactory,
        resets: FunctionResets,
        *,
        own_pid: int | None = None,
        after_reset: AfterReset | None = None,
    ) -> None:
        self.root = root
        self.reloader = reloader
        self.nvml = nvml
        self.resets = resets
        self.own_pid = os.getpid() if own_pid is None else own_pid
        self.after_reset = after_reset
        """Puts back what a reset takes from the GPUs (their MIG instances, `mig.reapply`)."""

    async def context(self) -> StepContext:
        """The GPU driver running before the reset: what a run resumed after a crash in the
        middle of a driver reload loads again."""
        return StepContext(
            from_version=self.reloader.loaded_version(Component.GPU),
            modules=await self.reloader.loaded_modules(Component.GPU),
        )

    async def reset(
        self,
        command_id: str,
        command: remediation_commands.ResetGpu,
        context: StepContext | None = None,
    ) -> Answer:
        wanted = tuple(dict.fromkeys(command.gpu_uuids))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + command.timeout_seconds

        def failed(reason: Reason, message: str) -> remediation_commands.GpuResetFailed:
            log.error("GPU reset of %s failed (%s): %s", " ".join(wanted), reason, message)
            return remediation_commands.GpuResetFailed(
                command_id=command_id,
                gpu_uuids=command.gpu_uuids,
                reason=reason,
                message=message[:MAX_MESSAGE],
            )

        async def reset(method: remediation_commands.ResetMethod) -> Answer:
            if self.after_reset is not None:
                problem = await self.after_reset(max(deadline - loop.time(), 1.0))
                if problem is not None:
                    return failed(Reason.RESET_FAILED, f"reset ({method}), but {problem}")
            log.info("reset %s (%s)", " ".join(wanted), method)
            return remediation_commands.GpuReset(
                command_id=command_id, gpu_uuids=command.gpu_uuids, method=method
            )

        try:
            await self._load_again(context or StepContext())
        except ResetRefused as refused:
            return failed(refused.reason, refused.message)
        try:
            async with asyncio.timeout_at(deadline):
                gpus, unanswered = await asyncio.to_thread(self._look)
                named, missing = _named(gpus, wanted)
                if missing and not unanswered:
                    message = f"not GPUs of this node: {' '.join(missing)}"
                    return failed(Reason.NOT_SUPPORTED, message)
                self._refuse_in_use(named)
                blocked = self._blockers(gpus, named)
                if missing:
                    blocked.append(
                        f"{' '.join(missing)} not among the GPUs NVML names, and "
                        f"{'; '.join(unanswered)}"
                    )
                if not blocked:
                    trouble = await self._reset_alone(named)
                    if trouble is None:
                        return await reset(remediation_commands.ResetMethod.NVML)
                    if not command.allow_driver_reload:
                        return failed(Reason.RESET_FAILED, trouble)
                    log.warning("%s; reloading the GPU driver instead", trouble)
                elif not command.allow_driver_reload:
                    message = "; ".join(blocked) + " (a driver reload was not allowed)"
                    return failed(Reason.NOT_SUPPORTED, message)
                self._refuse_any_in_use(gpus)
        except ResetRefused as refused:
            return failed(refused.reason, refused.message)
        except TimeoutError:
            return failed(
                Reason.TIMEOUT, f"the reset did not finish within {command.timeout_seconds} s"
            )
        try:
            await self._reload(max(deadline - loop.time(), 1.0))
            trouble = await asyncio.to_thread(self._still_failing, wanted)
        except ResetRefused as refused:
            return failed(refused.reason, refused.message)
        if trouble is not None:
            return failed(Reason.RESET_FAILED, f"after the driver reload: {trouble}")
        return await reset(remediation_commands.ResetMethod.DRIVER_RELOAD)

    # 1. looking

    def _look(self) -> tuple[tuple[Gpu, ...], tuple[str, ...]]:
        """The GPUs NVML can name, and what it says of those it cannot (a GPU fallen off
        the bus answers not even its UUID)."""
        try:
            with opened(self.nvml()) as nvml:
                infos, unanswered = [], []
                for index in range(nvml.device_count()):
                    try:
                        infos.append(nvml.device_info(index))
                    except GpuFailure as exc:
                        unanswered.append(f"GPU {index} does not answer ({exc})")
                gpus = tuple(_gpu(nvml, info, infos) for info in infos)
                return gpus, tuple(unanswered)
        except NvmlError as exc:
            raise ResetRefused(Reason.RESET_FAILED, f"NVML cannot look at the GPUs: {exc}") from exc

    # 2. holders

    def _users(self, gpus: Iterable[Gpu], *, reload: bool = False) -> dict[str, list[str]]:
        """Who uses each GPU in use, by UUID: `name[pid]` (`?` when only NVML names it).
        The persistence daemon counts only for a `reload`: it runs no context a reset
        would kill, but holds the device files an unload needs free."""
        by_minor: dict[int, dict[int, str]] = {}
        for holder in holders.gpu_holders(self.root, excluding=self.own_pid):
            if holder.name.startswith(PERSISTENCE_DAEMON) and not reload:
                continue
            for minor in holder.minors:
                by_minor.setdefault(minor, {})[holder.pid] = holder.name
        users: dict[str, list[str]] = {}
        for gpu in gpus:
            found = dict(by_minor.get(gpu.minor, {}))
            for pid in gpu.computing:
                if pid != self.own_pid:
                    found.setdefault(pid, "?")
            if found:
                users[gpu.uuid] = [f"{name}[{pid}]" for pid, name in sorted(found.items())]
        return users

    def _refuse_in_use(self, named: tuple[Gpu, ...]) -> None:
        users = self._users(named)
        if users:
            raise ResetRefused(Reason.IN_USE, "in use: " + _listing(users))

    def _refuse_any_in_use(self, gpus: tuple[Gpu, ...]) -> None:
        """A driver reload resets every GPU: none may be in use, nor the driver's files."""
        users = self._users(gpus, reload=True)
        shared = [
            f"{h.name}[{h.pid}]"
            for h in holders.gpu_holders(self.root, excluding=self.own_pid)
            if not h.minors
        ]
        if users or shared:
            listing = _listing(users) if users else ""
            if shared:
                listing += ("; " if listing else "") + "the driver's files: " + " ".join(shared)
            raise ResetRefused(
                Reason.IN_USE, f"a driver reload resets every GPU, and in use: {listing}"
            )

    # 3. alone

    def _blockers(self, gpus: tuple[Gpu, ...], named: tuple[Gpu, ...]) -> list[str]:
        """Why some named GPU cannot be reset alone; empty when every one can."""
        busy = set(self._users(gpus))
        names = {gpu.uuid for gpu in named}
        found = []
        for gpu in named:
            if gpu.failing is not None:
                found.append(f"{gpu.uuid} does not answer NVML ({gpu.failing})")
            elif not self.resets.offered(gpu.pci_bus_id):
                found.append(f"the host offers no function reset of {gpu.uuid} ({gpu.pci_bus_id})")
            elif not gpu.resets_beside_peers and (running := sorted((gpu.peers & busy) - names)):
                peers = " ".join(running)
                found.append(f"{gpu.uuid} resets only with its NVLink peers, in use: {peers}")
        return found

    async def _reset_alone(self, named: tuple[Gpu, ...]) -> str | None:
        """Reset each GPU; what went wrong, or None when all came back clean."""
        for gpu in named:
            try:
                await self.resets.reset(gpu.pci_bus_id)
            except FunctionResetFailed as exc:
                return f"{gpu.uuid}: {exc}"
        return await asyncio.to_thread(self._still_failing, tuple(gpu.uuid for gpu in named))

    def _still_failing(self, wanted: tuple[str, ...]) -> str | None:
        """What a new NVML session finds wrong with the GPUs after a reset; None if nothing."""
        try:
            with opened(self.nvml()) as nvml:
                found = {}
                for index in range(nvml.device_count()):
                    found[nvml.device_info(index).uuid] = index
                problems = []
                for uuid in wanted:
                    if uuid not in found:
                        problems.append(f"{uuid} is gone")
                        continue
                    try:
                        metrics = nvml.metrics(found[uuid])
                    except GpuFailure as exc:
                        problems.append(f"{uuid} does not answer: {exc}")
                        continue
                    if metrics.ecc_volatile_uncorrected:
                        errors = metrics.ecc_volatile_uncorrected
                        problems.append(f"{uuid} reports {errors} uncorrectable ECC errors")
                    if metrics.remapped_rows_pending:
                        problems.append(f"{uuid} still has a row remap pending")
        except NvmlError as exc:
            return f"NVML cannot look at the GPUs: {exc}"
        return "; ".join(problems) or None

    # 4. the driver reload

    async def _load_again(self, context: StepContext) -> None:
        """Load the driver an interrupted run of the same command unloaded, if it did."""
        if context.from_version is None or self.reloader.loaded_version(Component.GPU):
            return
        log.warning("the GPU driver is not loaded: loading %s again", context.from_version)
        try:
            await self.reloader.load(Component.GPU, context.from_version, context.modules)
        except LoadError as exc:
            message = f"the GPU driver {context.from_version} did not load again: {exc.message}"
            raise ResetRefused(Reason.RESET_FAILED, message) from None

    async def _reload(self, timeout: float) -> None:
        version = self.reloader.loaded_version(Component.GPU)
        modules = await self.reloader.loaded_modules(Component.GPU)
        if version is None or not modules:
            raise ResetRefused(Reason.RESET_FAILED, "the GPU driver is not loaded")
        try:
            await self.reloader.unload(Component.GPU, timeout, False)
        except UnloadError as exc:
            reason = {
                "in-use": Reason.IN_USE,
                "timeout": Reason.TIMEOUT,
            }.get(exc.reason.value, Reason.RESET_FAILED)
            raise ResetRefused(reason, f"the GPU driver did not unload: {exc.message}") from None
        try:
            await self.reloader.load(Component.GPU, version, modules)
        except LoadError as exc:
            raise ResetRefused(
                Reason.RESET_FAILED, f"the GPU driver {version} did not load again: {exc.message}"
            ) from None


def _named(
    gpus: tuple[Gpu, ...], wanted: tuple[str, ...]
) -> tuple[tuple[Gpu, ...], tuple[str, ...]]:
    """The wanted GPUs NVML named, and the UUIDs of those it did not."""
    by_uuid = {gpu.uuid: gpu for gpu in gpus}
    named = tuple(by_uuid[uuid] for uuid in wanted if uuid in by_uuid)
    return named, tuple(uuid for uuid in wanted if uuid not in by_uuid)


def _gpu(nvml: Nvml, info: DeviceInfo, infos: list[DeviceInfo]) -> Gpu:
    """The GPU as NVML shows it: its peers over NVLink, what computes on it, or why it does
    not answer."""
    index = info.index
    failing: str | None = None
    try:
        computing = tuple(process.pid for process in nvml.metrics(index).processes)
        peers = frozenset(
            other.uuid
            for other in infos
            if other.index != index and nvml.topology(index, other.index).nvlink
        )
    except GpuFailure as exc:
        computing, peers, failing = (), frozenset(), str(exc) or type(exc).__name__
    return Gpu(
        index=index,
        uuid=info.uuid,
        pci_bus_id=info.pci_bus_id,
        minor=info.minor_number,
        resets_beside_peers=info.compute_capability_major >= RESETS_ALONE_FROM,
        peers=peers,
        computing=computing,
        failing=failing,
    )


def _listing(users: dict[str, list[str]]) -> str:
    return "; ".join(f"{uuid}: {' '.join(found)}" for uuid, found in sorted(users.items()))
