"""switch-back-required: compensation after `SetDeviceApi` was sent: the device plugin
serves the API of the start again, then the node is uncordoned and the switch fails. A
switch back that fails too (or does not answer) fails the switch with the node cordoned:
no API is known to serve its GPUs, an operator is needed."""

from __future__ import annotations

from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.device_api_commands import SetDeviceApi
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.device_api.drafting import Draft, issue
from gpuop.saga.device_api.phases.common import applied, refusal, start
from gpuop.saga.device_api.records import DeviceApiSaga, StepResult, SwitchStepKind
from gpuop.saga.device_api.states import DeviceApiState as S
from gpuop.saga.machine import Effects, Trigger, overdue

STATE = S.SWITCH_BACK_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    start(draft, SwitchStepKind.SWITCH_BACK)


def on_event(draft: Draft, trigger: Trigger) -> None:
    previous = draft.saga.previous
    answer = applied(draft, trigger, previous)
    if answer is True:
        draft.update(switched_back=True)
        draft.outcome(StepResult.SUCCEEDED, f"{previous} served again")
        draft.move(S.UNCORDON_REQUIRED, f"{previous} served again")
    elif answer is False:
        _not_back(draft, refusal(trigger), StepResult.FAILED)


def on_deadline(draft: Draft, expired: DeadlineExpired) -> None:
    _not_back(draft, overdue(draft), StepResult.EXPIRED)


def _not_back(draft: Draft, detail: str, result: StepResult) -> None:
    saga = draft.saga
    draft.update(switched_back=False)
    draft.outcome(result, detail)
    first = saga.failure.reason if saga.failure is not None else "failed"
    reason = f"{first}; the switch back to {saga.previous} failed too ({detail}): left cordoned"
    draft.move(S.FAILED, reason)


def effects(saga: DeviceApiSaga, spec: GPUClusterPolicySpec) -> Effects:
    reason = f"switching back to {saga.previous}: the switch to {saga.api} failed"
    return (issue(saga, SetDeviceApi(api=saga.previous, reason=reason)),), ()
