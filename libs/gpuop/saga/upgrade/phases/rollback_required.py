"""rollback-required: restore the previous version of every touched component, in unload
order; validation-required then validates what was restored.

When the validation ladder's pod rung had resumed the operands (`validate-resume`) and then
failed, they hold the GPUs again: they are paused once more first (`operands-pause-2`, its
own command id, so the bus does not drop it as the first pause's duplicate)."""

from __future__ import annotations

from gpuop.events import device as dev
from gpuop.events.upgrade import UpgradeState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import operands
from gpuop.saga.machine import Effects, StepResult, Trigger
from gpuop.saga.upgrade.drafting import Draft
from gpuop.saga.upgrade.effects import driver_effects, issue
from gpuop.saga.upgrade.phases.common import fail_on_deadline, on_driver_result
from gpuop.saga.upgrade.records import NodeSaga
from gpuop.saga.upgrade.steps import Step, StepKind, after, rollback_plan

STATE = S.ROLLBACK_REQUIRED
REPAUSE = Step(kind=StepKind.OPERANDS_PAUSE, round=2)
"""The pause again of operands the pod rung resumed."""


def enter(draft: Draft, retry: bool) -> None:
    draft.update(rolled_back=())
    saga = draft.saga
    if saga.operands and not saga.operands_paused:
        draft.update(paused=(), operands_paused=True)
        draft.start(REPAUSE)
        return
    draft.start(rollback_plan(draft.rollback_components())[0])


def _next_step(draft: Draft) -> None:
    following = after(rollback_plan(draft.rollback_components()), draft.saga.step)
    if following is None:
        draft.move(S.VALIDATION_REQUIRED, "previous drivers restored")
    else:
        draft.start(following)


def _on_paused(draft: Draft, trigger: Trigger) -> None:
    if operands.count(draft, trigger, dev.OperandPaused):
        draft.outcome(StepResult.SUCCEEDED, "every operand paused again")
        draft.start(rollback_plan(draft.rollback_components())[0])


def on_event(draft: Draft, trigger: Trigger) -> None:
    if draft.saga.step == REPAUSE:
        _on_paused(draft, trigger)
    else:
        on_driver_result(draft, trigger, _next_step)


on_deadline = fail_on_deadline


def effects(saga: NodeSaga, spec: GPUClusterPolicySpec) -> Effects:
    """The pause again, or the rollback command of the pending component."""
    if saga.step == REPAUSE:
        pause = dev.PauseOperands(
            components=saga.components, reason=f"rollback of {saga.rollout_id}"
        )
        return (issue(saga, pause, saga.step.token),), ()
    return driver_effects(saga, spec)
