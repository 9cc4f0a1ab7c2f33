"""The runtime-configure step on this node: `ConfigureRuntime` in, `RuntimeConfigured` or
`RuntimeConfigureFailed` out.

`executor.Executor` calls `RuntimeConfigurer.configure` for the command, which the
orchestrator sends after the loads while the node is cordoned and drained. The node's
runtime is found under the host root (containerd's main config, else CRI-O's), its plan made
by `gpuop.host.runtimes`, and applied by `gpuop.host.restarting`: drop-in written, runtime
restarted through the `RuntimeService` (systemd on a real node, the simulated host's own on
a simulated one), its socket answering within the command's timeout, or the earlier files
put back and the runtime restarted with them.

A crash between the write and the confirmed restart would leave a drop-in the runtime has
not loaded, which the next run's plan sees as done: a marker written before the write, with
what the files held, and removed after the answer makes the redelivered command restart and
confirm anyway, and undo to those files if the runtime does not answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace

from gpuop.clocks import Clock
from gpuop.events import driver as dm
from gpuop.host import restarting, runtimes
from gpuop.host.errors import HostReadError
from gpuop.host.files import write_atomic
from gpuop.host.restarting import RuntimeRestartFailed, RuntimeService
from gpuop.host.roots import HostRoot
from gpuop.host.runtimes import Runtime, RuntimeConfigError

log = logging.getLogger(__name__)

PENDING = "var/lib/gpuop/runtime-restart-pending"
"""Present from the drop-in's write until the restarted runtime answered."""


def installed_runtime(root: HostRoot) -> Runtime | None:
    """The runtime whose configuration the host has: containerd first (its main config),
    then CRI-O (its main config or drop-in directory); None when neither."""
    if root.exists(runtimes.CONTAINERD_CONFIG):
        return Runtime.CONTAINERD
    if root.exists(runtimes.CRIO_CONFIG) or root.exists(runtimes.CRIO_DROP_IN_DIR):
        return Runtime.CRIO
    return None


class RuntimeConfigurer:
    """Gives this node's container runtime the `nvidia` handler, restarting it to load it."""

    def __init__(self, root: HostRoot, service: RuntimeService, clock: Clock) -> None:
        self.root = root
        self.service = service
        self.clock = clock

    async def configure(
        self, command_id: str, command: dm.ConfigureRuntime
    ) -> dm.RuntimeConfigured | dm.RuntimeConfigureFailed:
        runtime = installed_runtime(self.root)
        if runtime is None:
            message = (
                f"no container runtime config under {self.root.path} "
                f"({runtimes.CONTAINERD_CONFIG}, {runtimes.CRIO_CONFIG})"
            )
            return self._failed(command_id, command, dm.RuntimeFailureReason.NOT_FOUND, message)
        try:
            planned = await asyncio.to_thread(
                runtimes.plan, self.root, runtime, runtime_path=command.runtime_path
            )
        except RuntimeConfigError as error:
            reason = dm.RuntimeFailureReason.NOT_FOUND
            return self._failed(command_id, command, reason, str(error))
        except HostReadError as error:
            reason = dm.RuntimeFailureReason.UNREADABLE
            return self._failed(command_id, command, reason, str(error))
        pending = self.root.join(PENDING)
        if pending.exists():
            # a run before this one wrote and did not see the runtime answer: restart and
            # confirm again, undoing to what the files held before that run
            log.warning("%s was configured by an interrupted run: restarting it", runtime)
            planned = _resumed(self.root, planned, pending.read_text())
        elif not planned.changed:
            return self._configured(command_id, runtime, planned, changed=False)
        else:
            write_atomic(pending, _remembered(planned))
        try:
            applied = await restarting.configure(
                self.root, planned, self.service, self.clock, command.timeout_seconds
            )
        except RuntimeRestartFailed as failure:
            pending.unlink(missing_ok=True)
            reason = (
                dm.RuntimeFailureReason.NOT_ANSWERING
                if failure.not_answering
                else dm.RuntimeFailureReason.RESTART_FAILED
            )
            return self._failed(command_id, command, reason, failure.reason, failure.restored)
        pending.unlink(missing_ok=True)
        return self._configured(
            command_id, runtime, planned, changed=True, seconds=applied.waited_seconds
        )

    def _configured(
        self,
        command_id: str,
        runtime: Runtime,
        planned: runtimes.RuntimePlan,
        *,
        changed: bool,
        seconds: float | None = None,
    ) -> dm.RuntimeConfigured:
        for note in planned.notes:
            log.warning("%s", note)
        return dm.RuntimeConfigured(
            command_id=command_id,
            component=dm.Component.GPU,
            runtime=runtime.value,
            drop_in="/" + planned.drop_in,
            changed=changed,
            config_version=planned.config_version,
            restart_seconds=seconds,
        )

    def _failed(
        self,
        command_id: str,
        command: dm.ConfigureRuntime,
        reason: dm.RuntimeFailureReason,
        message: str,
        restored: bool = True,
    ) -> dm.RuntimeConfigureFailed:
        log.error("runtime not configured (%s): %s", reason, message)
        return dm.RuntimeConfigureFailed(
            command_id=command_id,
            component=command.component,
            reason=reason,
            message=message[:2048],
            restored=restored,
        )


def _remembered(planned: runtimes.RuntimePlan) -> str:
    """What the files held before `planned`, for the undo of a run resumed after a crash."""
    return json.dumps([{"relative": c.relative, "before": c.before} for c in planned.changes])


def _resumed(
    root: HostRoot, planned: runtimes.RuntimePlan, remembered: str
) -> runtimes.RuntimePlan:
    """`planned` as the interrupted run planned it: the files it changed, from what they
    held before it (the marker) to what they should hold now."""
    wanted = {c.relative: c.after for c in planned.changes}
    changes = []
    for entry in json.loads(remembered):
        relative = entry["relative"]
        after = wanted.get(relative, root.read_text(relative) or "")
        changes.append(runtimes.FileChange(relative, entry["before"], after))
    return replace(planned, changes=tuple(changes))
