"""release-required: the GPUs validated; the node goes back to work in two steps, and
remediation-done is entered only once both are confirmed, so a subscriber acting on the
done event finds the node released:

    release   the operands resume (skipped when the ladder's pod rung resumed them, or a
              folded remediation never paused them), confirmed by every operand
    untaint   `GPUHealthy` True and the taint `gpuop.io/gpu-unhealthy` off (`MirrorHealth`;
              on a DRA node, the DeviceTaintRules of the quarantined devices deleted),
              confirmed by the executor's `NodeUntainted` once the API server took the
              writes

GPUs that failed after this attempt asked for its holders (too late for its reset) get the
next attempt instead, from its admission (which quarantines the node again). A release whose
confirmation does not come within its deadline (`remediation.deadlines.operandsPause`; the
outbox retries a temporary API failure meanwhile) fails the remediation with that reason:
remediation-failed puts the condition False and the taint back (when the policy
quarantines), so a half-applied release never leaves a failed node schedulable."""

from __future__ import annotations

from collections.abc import Callable

from gpuop.events import device as dev
from gpuop.events import kube
from gpuop.events.remediation import RemediationState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.machine import Effects, StepResult, Trigger
from gpuop.saga.remediation.actions import MirrorHealth
from gpuop.saga.remediation.drafting import Draft
from gpuop.saga.remediation.phases.common import (
    action_id,
    fail_on_deadline,
    issue,
    on_operands,
    quarantined_devices,
)
from gpuop.saga.remediation.records import RemediationSaga, Step

STATE = S.RELEASE_REQUIRED
RESUME = "release"
UNTAINT = "untaint"


def enter(draft: Draft, retry: bool) -> None:
    if not draft.saga.operands_paused:
        draft.take(Step(name=RESUME))
        draft.outcome(StepResult.SKIPPED, "operands running")
        _next_attempt_or(draft, "the GPUs validated, operands running", _untaint)
        return
    draft.update(paused=())
    draft.start(Step(name=RESUME))


def _late(draft: Draft) -> dict[str, tuple[int, ...]]:
    saga = draft.saga
    return {gpu: xids for gpu, xids in saga.unhealthy.items() if gpu not in saga.gpu_uuids}


def _next_attempt_or(draft: Draft, reason: str, then: Callable[[Draft, str], None]) -> None:
    """The next attempt's admission for GPUs that failed meanwhile, else `then(reason)`."""
    late = _late(draft)
    if not late:
        then(draft, reason)
        return
    draft.update(
        unhealthy=late, gpu_uuids=tuple(sorted(late)), holders=(), holders_unknown=False,
        rebooted=False, boot_id_at_reboot=None,
    )  # fmt: skip
    draft.move(S.ADMISSION_REQUIRED, f"{reason}; {', '.join(sorted(late))} failed meanwhile")


def _untaint(draft: Draft, reason: str) -> None:
    draft.start(Step(name=UNTAINT))


def _released(draft: Draft, reason: str) -> None:
    draft.move(S.DONE, reason)


def _resumed(draft: Draft) -> None:
    draft.update(operands_paused=False)
    draft.outcome_ok("every operand resumed")
    _next_attempt_or(draft, "operands resumed", _untaint)


def _on_untainted(draft: Draft, trigger: Trigger) -> None:
    if isinstance(trigger, kube.NodeUntainted) and trigger.action_id == draft.step_id():
        draft.update(quarantined_devices=())
        draft.outcome_ok("GPUHealthy True, taint removed")
        _next_attempt_or(draft, "the node released: GPUHealthy True, taint removed", _released)


def on_event(draft: Draft, trigger: Trigger) -> None:
    if draft.saga.step.name == UNTAINT:
        _on_untainted(draft, trigger)
    else:
        on_operands(draft, trigger, dev.OperandResumed, _resumed)


on_deadline = fail_on_deadline


def effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    if saga.step.name == UNTAINT:
        devices = quarantined_devices(saga)
        return (), (MirrorHealth(id=action_id(saga), unhealthy=(), taint=False, devices=devices),)
    return (issue(saga, dev.ResumeOperands(reason=f"GPU remediation {saga.saga_id} done")),), ()
