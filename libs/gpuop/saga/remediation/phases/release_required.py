"""release-required: the GPUs validated; the operands resume (when the ladder's pod rung did
not resume them already), then remediation-done releases the node. GPUs that failed after
this attempt asked for its holders (too late for its reset) get the next attempt instead,
from its admission."""

from __future__ import annotations

from gpuop.events import device as dev
from gpuop.events.remediations import RemediationState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.machine import Effects, Trigger
from gpuop.saga.remediation.drafting import Draft
from gpuop.saga.remediation.phases.common import Result, fail_on_deadline, issue, on_operands
from gpuop.saga.remediation.records import RemediationSaga, Step

STATE = S.RELEASE_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    if not draft.saga.operands_paused:
        draft.update(step=Step(name="release"), step_started=draft.now, deadline=None)
        draft.outcome(Result.SKIPPED, "operands running")
        _finish(draft, "the GPUs validated, operands running")
        return
    draft.update(paused=())
    draft.start(Step(name="release"))


def _finish(draft: Draft, reason: str) -> None:
    saga = draft.saga
    late = {gpu: xids for gpu, xids in saga.unhealthy.items() if gpu not in saga.gpu_uuids}
    if not late:
        draft.move(S.DONE, reason)
        return
    draft.update(
        unhealthy=late, gpu_uuids=tuple(sorted(late)), holders=(), holders_unknown=False,
        rebooted=False, boot_id_at_reboot=None,
    )  # fmt: skip
    draft.move(S.ADMISSION_REQUIRED, f"{reason}; {', '.join(sorted(late))} failed meanwhile")


def _resumed(draft: Draft) -> None:
    draft.update(operands_paused=False)
    draft.outcome_ok("every operand resumed")
    _finish(draft, "operands resumed")


def on_event(draft: Draft, trigger: Trigger) -> None:
    on_operands(draft, trigger, dev.OperandResumed, _resumed)


on_deadline = fail_on_deadline


def effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    return (issue(saga, dev.ResumeOperands(reason=f"GPU remediation {saga.saga_id} done")),), ()
