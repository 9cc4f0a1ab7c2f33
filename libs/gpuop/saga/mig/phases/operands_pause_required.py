"""operands-pause-required: the node's operands release the GPUs, and the device plugin
advertises them Unhealthy meanwhile, so the kubelet gives no new pod a GPU being re-carved.

That pause is the hold on the GPUs, taken before their holders are listed: a pod admitted
between the listing and the apply would otherwise hold a GPU the apply then finds in use.
The node is not cordoned (a re-carve takes some GPUs, not the node: pods without GPUs, and
the pods running on the other GPUs, carry on), as upstream's MIG manager does not cordon; it
stops the same operands (device plugin, GPU Feature Discovery, DCGM) for the change.
"""

from __future__ import annotations

from gpuop.events import device as dev
from gpuop.events.driver import Component
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import operands
from gpuop.saga.machine import Effects, StepResult, Trigger
from gpuop.saga.mig.drafting import Draft, issue
from gpuop.saga.mig.phases.common import fail_on_deadline, start
from gpuop.saga.mig.records import MigSaga, MigStep, MigStepKind
from gpuop.saga.mig.states import MigState as S

STATE = S.OPERANDS_PAUSE_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    if not draft.saga.operands:
        step = MigStep(kind=MigStepKind.OPERANDS_PAUSE)
        draft.skip(step, S.HOLDERS_EVICTION_REQUIRED, StepResult.SKIPPED, "no operands")
        return
    draft.update(paused=(), operands_paused=True)
    start(draft, MigStepKind.OPERANDS_PAUSE)


def on_event(draft: Draft, trigger: Trigger) -> None:
    if operands.count(draft, trigger, dev.OperandPaused):
        draft.outcome(StepResult.SUCCEEDED, "every operand paused")
        draft.move(S.HOLDERS_EVICTION_REQUIRED, "operands released the GPUs")


on_deadline = fail_on_deadline


def effects(saga: MigSaga, spec: GPUClusterPolicySpec) -> Effects:
    pause = dev.PauseOperands(
        components=(Component.GPU,), reason=f"MIG reconfiguration to {saga.config}"
    )
    return (issue(saga, pause, saga.step.token),), ()
