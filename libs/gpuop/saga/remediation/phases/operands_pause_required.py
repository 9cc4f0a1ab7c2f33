"""operands-pause-required: the node's operands (device plugin, telemetry, discovery)
release the GPU stack, as for an upgrade's reload; then the reset, the reboot at once when
the fault asks for one (`reboot`), or the hand-over for new hardware (`drain-and-replace`)."""

from __future__ import annotations

from gpuop.events import device as dev
from gpuop.events import driver as dm
from gpuop.events.device import XidAction
from gpuop.events.remediation import RemediationState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.machine import Effects, Trigger
from gpuop.saga.remediation.drafting import Draft
from gpuop.saga.remediation.phases.common import fail_on_deadline, issue, on_operands
from gpuop.saga.remediation.records import RemediationSaga, Step

STATE = S.OPERANDS_PAUSE_REQUIRED
REBOOTING = frozenset({XidAction.REBOOT})
"""Faults no reset clears but a reboot may: the node reboots instead."""


def enter(draft: Draft, retry: bool) -> None:
    draft.update(paused=(), operands_paused=bool(draft.saga.operands))
    draft.start(Step(name="operands-pause"))
    if not draft.saga.operands:
        draft.outcome_ok("no operands")
        _paused(draft)


def _paused(draft: Draft) -> None:
    if draft.saga.action is XidAction.DRAIN_AND_REPLACE:
        draft.move(S.REPLACEMENT_REQUIRED, "the fault asks for new hardware")
    elif draft.saga.action in REBOOTING:
        draft.reboot(f"the fault asks for a {draft.saga.action}")
    else:
        draft.move(S.RESET_REQUIRED, "operands released the GPUs")


def _every_operand(draft: Draft) -> None:
    draft.outcome_ok("every operand paused")
    _paused(draft)


def on_event(draft: Draft, trigger: Trigger) -> None:
    on_operands(draft, trigger, dev.OperandPaused, _every_operand)


on_deadline = fail_on_deadline


def effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    pause = dev.PauseOperands(
        components=(dm.Component.GPU,), reason=f"GPU remediation {saga.saga_id}"
    )
    return (issue(saga, pause),), ()
