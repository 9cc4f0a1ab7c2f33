"""gpu-reset-required: the driver-manager resets the GPUs (each alone, or, when
`remediation.allowDriverReload`, by a driver unload and load); a failure or the deadline
reboots the node when the policy allows (`Draft.reboot`), else fails."""

from __future__ import annotations

from gpuop.events import remediation_commands as cmd
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.remediation import RemediationState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.machine import Effects, Trigger
from gpuop.saga.remediation.drafting import Draft
from gpuop.saga.remediation.phases.common import issue, timeout
from gpuop.saga.remediation.records import RemediationSaga, Step

STATE = S.RESET_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    draft.start(Step(name="reset"))


def on_event(draft: Draft, trigger: Trigger) -> None:
    if not isinstance(trigger, cmd.GpuReset | cmd.GpuResetFailed):
        return
    if trigger.command_id != draft.step_id():
        return
    if isinstance(trigger, cmd.GpuReset):
        draft.outcome_ok(f"reset ({trigger.method})")
        draft.move(S.VALIDATION_REQUIRED, f"GPUs reset ({trigger.method})")
        return
    draft.reset_failed(f"GpuResetFailed {trigger.reason}: {trigger.message}".rstrip(": "))


def on_deadline(draft: Draft, expired: DeadlineExpired) -> None:
    draft.reset_failed("reset did not finish in time", expired=True)


def effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    reset = cmd.ResetGpu(
        gpu_uuids=saga.gpu_uuids,
        allow_driver_reload=spec.remediation.allow_driver_reload,
        timeout_seconds=timeout(saga, spec),
    )
    return (issue(saga, reset),), ()
