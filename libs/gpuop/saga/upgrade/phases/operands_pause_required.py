"""operands-pause-required: every operand on the node (device plugin, discovery, telemetry)
is to release the devices and confirm it."""

from __future__ import annotations

from gpuop.events import device as dev
from gpuop.events.upgrade import UpgradeState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import operands
from gpuop.saga.machine import Effects, StepResult, Trigger
from gpuop.saga.upgrade.drafting import Draft
from gpuop.saga.upgrade.effects import issue
from gpuop.saga.upgrade.phases.common import fail_on_deadline, start_or_pass
from gpuop.saga.upgrade.records import NodeSaga
from gpuop.saga.upgrade.steps import StepKind

STATE = S.OPERANDS_PAUSE_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    any_operands = bool(draft.saga.operands)
    if any_operands:
        draft.update(paused=(), operands_paused=True)
    next_state = S.DRIVER_RELOAD_REQUIRED
    start_or_pass(draft, StepKind.OPERANDS_PAUSE, any_operands, next_state, "no operands")


def on_event(draft: Draft, trigger: Trigger) -> None:
    if operands.count(draft, trigger, dev.OperandPaused):
        draft.outcome(StepResult.SUCCEEDED, "every operand paused")
        draft.move(S.DRIVER_RELOAD_REQUIRED, "operands released the devices")


on_deadline = fail_on_deadline


def effects(saga: NodeSaga, spec: GPUClusterPolicySpec) -> Effects:
    pause = dev.PauseOperands(
        components=saga.components, reason=f"driver upgrade of {saga.rollout_id}"
    )
    return (issue(saga, pause, saga.step.token),), ()
