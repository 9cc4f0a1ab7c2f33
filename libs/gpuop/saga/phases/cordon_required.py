"""cordon-required: the node is to be unschedulable; seeing it so moves on."""

from __future__ import annotations

from gpuop.events import kube
from gpuop.events.upgrade import UpgradeState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.actions import Cordon
from gpuop.saga.drafting import Draft
from gpuop.saga.effects import action_id
from gpuop.saga.machine import Effects, Trigger
from gpuop.saga.phases.common import fail_on_deadline
from gpuop.saga.records import NodeSaga, StepResult
from gpuop.saga.steps import Step, StepKind

STATE = S.CORDON_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    draft.update(cordoned=True)
    draft.start(Step(kind=StepKind.CORDON))


def on_event(draft: Draft, trigger: Trigger) -> None:
    saga = draft.saga
    if isinstance(trigger, kube.NodeCordoned) and trigger.action_id in (None, draft.step_id()):
        if trigger.was_unschedulable and saga.attempt == 1 and trigger.action_id is not None:
            draft.update(initially_unschedulable=True)
    elif not (isinstance(trigger, kube.NodeObserved) and trigger.unschedulable):
        return
    draft.outcome(StepResult.SUCCEEDED, "node unschedulable")
    draft.move(S.WAIT_FOR_JOBS_REQUIRED, "node cordoned")


on_deadline = fail_on_deadline


def effects(saga: NodeSaga, spec: GPUClusterPolicySpec) -> Effects:
    return (), (Cordon(id=action_id(saga, saga.step.token)),)
