"""uncordon-required: the node is made schedulable again, unless it was cordoned before
the switch; then the switch ends: done when nothing failed, failed with the first
failure's reason otherwise (the API of the start served again)."""

from __future__ import annotations

from gpuop.events import kube
from gpuop.events.deadlines import DeadlineExpired
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.actions import Uncordon
from gpuop.saga.device_api.drafting import Draft, action_id
from gpuop.saga.device_api.phases.common import answers_action, start
from gpuop.saga.device_api.records import (
    DeviceApiSaga,
    StepResult,
    SwitchFailure,
    SwitchStep,
    SwitchStepKind,
)
from gpuop.saga.device_api.states import DeviceApiState as S
from gpuop.saga.machine import Effects, Trigger, overdue

STATE = S.UNCORDON_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    saga = draft.saga
    if not saga.cordoned or saga.was_unschedulable:
        draft.take(SwitchStep(kind=SwitchStepKind.UNCORDON))
        draft.outcome(StepResult.SKIPPED, "cordoned before the switch: left so")
        _end(draft)
        return
    start(draft, SwitchStepKind.UNCORDON)


def on_event(draft: Draft, trigger: Trigger) -> None:
    if isinstance(trigger, kube.NodeUncordoned) and answers_action(draft, trigger):
        draft.update(cordoned=False)
        draft.outcome(StepResult.SUCCEEDED, "uncordoned")
        _end(draft)


def on_deadline(draft: Draft, expired: DeadlineExpired) -> None:
    saga = draft.saga
    detail = overdue(draft)
    draft.outcome(StepResult.EXPIRED, detail)
    if saga.failure is None:
        failure = SwitchFailure(state=saga.state, step=saga.step.kind, reason=detail, at=draft.now)
        draft.update(failure=failure)
    _end(draft)


def _end(draft: Draft) -> None:
    saga = draft.saga
    if saga.failure is None:
        draft.move(S.DONE, f"the node serves its GPUs through {saga.api}")
        return
    reason = saga.failure.reason
    if saga.switched_back:
        reason = f"{reason}; {saga.previous} is served again"
    draft.move(S.FAILED, reason)


def effects(saga: DeviceApiSaga, spec: GPUClusterPolicySpec) -> Effects:
    return (), (Uncordon(id=action_id(saga)),)
