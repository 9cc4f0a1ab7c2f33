"""operands-resume-required: the operands use the GPUs again; the device plugin advertises
the MIG devices the node has now (the new ones, or the old ones after a failure) and
discovery's next inventory relabels the node. Then the request ends: done when nothing
failed, failed with the first failure's reason otherwise (the layout is in force either
way: a resume that does not confirm fails the request, but restores nothing).
"""

from __future__ import annotations

from gpuop.events import device as dev
from gpuop.events.deadlines import DeadlineExpired
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import operands
from gpuop.saga.machine import Effects, StepResult, Trigger, overdue
from gpuop.saga.mig.drafting import Draft, issue
from gpuop.saga.mig.phases.common import start
from gpuop.saga.mig.records import MigFailure, MigSaga, MigStep, MigStepKind
from gpuop.saga.mig.states import MigState as S

STATE = S.OPERANDS_RESUME_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    if not draft.saga.operands_paused:
        draft.take(MigStep(kind=MigStepKind.OPERANDS_RESUME))
        draft.outcome(StepResult.SKIPPED, "no operand paused")
        _end(draft)
        return
    draft.update(resumed=())
    start(draft, MigStepKind.OPERANDS_RESUME)


def on_event(draft: Draft, trigger: Trigger) -> None:
    if operands.count(draft, trigger, dev.OperandResumed, "resumed"):
        draft.update(operands_paused=False)
        draft.outcome(StepResult.SUCCEEDED, "every operand resumed")
        _end(draft)


def on_deadline(draft: Draft, expired: DeadlineExpired) -> None:
    saga = draft.saga
    missing = [s.value for s in saga.operands if s not in saga.resumed]
    detail = f"{overdue(draft)}: {', '.join(missing)} did not confirm"
    draft.outcome(StepResult.EXPIRED, detail)
    if saga.failure is None:
        failure = MigFailure(state=saga.state, step=saga.step.kind, reason=detail, at=draft.now)
        draft.update(failure=failure)
    _end(draft)


def _end(draft: Draft) -> None:
    saga = draft.saga
    if saga.failure is None:
        draft.move(S.MIG_CONFIG_DONE, f"{saga.config} is in force")
        return
    reason = saga.failure.reason
    if saga.restored is True:
        reason = f"{reason}; the layout at the start is back"
    elif saga.restored is False:
        reason = f"{reason}; the layout at the start could not be put back"
    draft.move(S.MIG_CONFIG_FAILED, reason)


def effects(saga: MigSaga, spec: GPUClusterPolicySpec) -> Effects:
    resume = dev.ResumeOperands(reason=f"MIG reconfiguration to {saga.config} ended")
    return (issue(saga, resume, saga.step.token),), ()
