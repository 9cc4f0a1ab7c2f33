"""apply-required: the driver-manager gives the GPUs their layouts (`ApplyMigLayout`):
MIG mode on or off, GPU and compute instances destroyed and created, the result read back,
the CDI spec regenerated for the new MIG devices.

Its success (`MigLayoutApplied`) goes to verification. Its failure (`MigLayoutFailed`) says
whether the node put back the layout it read first (`restored`, also true when nothing was
changed): restored, the operands are resumed and the request fails; not restored, the saga
restores the layout recorded at its start (`restore-required`) when it knows it, and fails
with the GPUs as they are when it does not. No answer by the deadline counts as not
restored: the GPUs may be half re-carved.

A failure `mode-pending` (NVML left the new MIG mode pending until a reset the driver could
not make) reboots the node (`reboot-required`) when a boot id is known to confirm it, once;
after the reboot this step runs again as `apply-after-reboot`.
"""

from __future__ import annotations

from gpuop.events import mig_commands
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.machine import Effects, StepResult, Trigger
from gpuop.saga.mig.drafting import Draft, issue
from gpuop.saga.mig.phases.common import answers, fail_on_deadline, start, timeout
from gpuop.saga.mig.records import AppliedAnswer, MigSaga, MigStepKind
from gpuop.saga.mig.states import MigState as S

STATE = S.APPLY_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    draft.update(applied=True)
    start(draft, MigStepKind.REAPPLY if draft.saga.rebooted else MigStepKind.APPLY)


def _pending(draft: Draft, detail: str) -> None:
    """The MIG mode waits for a reboot: reboot once, when a new boot id can confirm it."""
    saga = draft.saga
    if saga.rebooted:
        draft.fail(f"{detail}; still pending after the reboot")
    elif saga.boot_id is None:
        draft.fail(f"{detail}; no boot id known to confirm a reboot")
    else:
        draft.outcome(StepResult.FAILED, detail)
        draft.update(boot_id_at_reboot=saga.boot_id)
        draft.move(S.REBOOT_REQUIRED, "the MIG mode is pending until a reboot")


def on_event(draft: Draft, trigger: Trigger) -> None:
    if isinstance(trigger, mig_commands.MigLayoutApplied) and answers(draft, trigger.command_id):
        answer = AppliedAnswer(
            config=trigger.config,
            changed_gpus=tuple(trigger.changed_gpus),
            mig_devices=trigger.mig_devices,
        )
        draft.update(answer=answer)
        changed = list(trigger.changed_gpus)
        draft.outcome(StepResult.SUCCEEDED, f"applied; GPUs changed: {changed}")
        draft.move(S.VERIFICATION_REQUIRED, "MigLayoutApplied")
    elif isinstance(trigger, mig_commands.MigLayoutFailed) and answers(draft, trigger.command_id):
        if trigger.restored:
            draft.update(restored=True)  # not restored: compensation restores, or says not
        undone = "the node restored the layout" if trigger.restored else "not restored"
        detail = f"MigLayoutFailed {trigger.reason} ({undone}): {trigger.message}"
        if trigger.reason is mig_commands.MigFailureReason.MODE_PENDING:
            _pending(draft, detail.rstrip(": "))
        else:
            draft.fail(detail.rstrip(": "))


on_deadline = fail_on_deadline


def effects(saga: MigSaga, spec: GPUClusterPolicySpec) -> Effects:
    apply = mig_commands.ApplyMigLayout(
        config=saga.config, layouts=saga.plan.layouts, timeout_seconds=timeout(saga, spec)
    )
    return (issue(saga, apply, saga.step.token),), ()
