"""restore-required: the layout recorded at the start is applied again, because the GPUs
may have changed and not as requested (the node did not undo a failed apply, did not answer,
or its answer did not verify). Entered only when that layout is known for every re-carved
GPU (`plans.MigPlan.restorable`); whatever the outcome, the operands are resumed next and
the request ends failed, its reason saying whether the layout is back.
"""

from __future__ import annotations

from gpuop.events import mig_commands
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.mig_commands import GpuMigLayout
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.machine import Effects, StepResult, Trigger, overdue
from gpuop.saga.mig.drafting import Draft, issue
from gpuop.saga.mig.phases.common import answers, start, timeout
from gpuop.saga.mig.records import MigSaga, MigStepKind
from gpuop.saga.mig.states import MigState as S

STATE = S.RESTORE_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    start(draft, MigStepKind.RESTORE)


def on_event(draft: Draft, trigger: Trigger) -> None:
    if isinstance(trigger, mig_commands.MigLayoutApplied) and answers(draft, trigger.command_id):
        draft.update(restored=True)
        draft.outcome(StepResult.SUCCEEDED, "the layout at the start is back")
        draft.move(S.OPERANDS_RESUME_REQUIRED, "the layout at the start is back")
    elif isinstance(trigger, mig_commands.MigLayoutFailed) and answers(draft, trigger.command_id):
        _not_restored(draft, f"restore failed, {trigger.reason}: {trigger.message}".rstrip(": "))


def on_deadline(draft: Draft, expired: DeadlineExpired) -> None:
    _not_restored(draft, overdue(draft), StepResult.EXPIRED)


def _not_restored(draft: Draft, detail: str, result: StepResult = StepResult.FAILED) -> None:
    draft.update(restored=False)
    draft.outcome(result, detail)
    draft.move(S.OPERANDS_RESUME_REQUIRED, f"the layout at the start is not back: {detail}")


def previous_layouts(saga: MigSaga) -> tuple[GpuMigLayout, ...]:
    """The layout each re-carved GPU had at the start."""
    return tuple(gpu.previous for gpu in saga.plan.recarved if gpu.previous is not None)


def effects(saga: MigSaga, spec: GPUClusterPolicySpec) -> Effects:
    restore = mig_commands.ApplyMigLayout(
        config=saga.config, layouts=previous_layouts(saga), timeout_seconds=timeout(saga, spec)
    )
    return (issue(saga, restore, saga.step.token),), ()
