"""The device-API switch's draft: the machinery's `Draft` with what its phases share.

Used inside one decision by the phases (`gpuop.saga.device_api.phases`): the failure path
(`fail`), and `announce`, which records a Kubernetes Event on the node for the moves an
administrator looks for (the switch started, a switch back, the end).

Compensation, in one place (`compensate`): what a failure leads to depends on what was done.

    SetDeviceApi sent, not switched back   switch-back-required (serve the start's API)
    the node cordoned by the saga          uncordon-required, then failed
    nothing done                           device-api-failed
"""

from __future__ import annotations

from enum import StrEnum

from gpuop.events import ids
from gpuop.saga import machine
from gpuop.saga.actions import RecordEvent
from gpuop.saga.device_api.records import DeviceApiSaga, StepResult, SwitchFailure
from gpuop.saga.device_api.states import DeviceApiState
from gpuop.saga.machine import Transition

S = DeviceApiState
EVENT_REASON = "DeviceApiSwitch"
"""Reason of the Kubernetes Events the saga records on the node."""
_WARNING_STATES = frozenset({S.FAILED, S.SWITCH_BACK_REQUIRED})
RECORDED_STATES = frozenset({S.CORDON_REQUIRED, S.DONE, *_WARNING_STATES})
"""The states whose entry is recorded as a Kubernetes Event on the node."""


class Draft(machine.Draft[DeviceApiSaga, DeviceApiState]):
    """A device-API switch being decided on; `decision()` is the result."""

    def fail(self, reason: str, result: StrEnum = StepResult.FAILED) -> None:
        """The pending step failed for `reason`: record it and compensate."""
        saga = self.saga
        self.outcome(result, reason)
        if saga.failure is None:
            failure = SwitchFailure(
                state=saga.state, step=saga.step.kind, reason=reason[:2048], at=self.now
            )
            self.update(failure=failure)
        self.compensate(reason)

    def compensate(self, reason: str) -> None:
        """Undo what was done, the most changed first (see the module docstring)."""
        saga = self.saga
        if saga.switched and saga.switched_back is None:
            self.move(S.SWITCH_BACK_REQUIRED, f"{reason}; serving {saga.previous} again")
        elif saga.cordoned and S.UNCORDON_REQUIRED in self.kind.table[saga.state]:
            self.move(S.UNCORDON_REQUIRED, f"{reason}; uncordoning")
        else:
            self.move(S.FAILED, reason)


issue = machine.issue
action_id = machine.action_id


def announce(
    saga: DeviceApiSaga, transition: Transition[DeviceApiState]
) -> tuple[RecordEvent, ...]:
    """An Event for `RECORDED_STATES`."""
    if transition.to_state not in RECORDED_STATES:
        return ()
    message = (
        f"{saga.previous} -> {saga.api}: {transition.from_state} -> {transition.to_state}: "
        f"{transition.reason}"
    )
    event = RecordEvent(
        id=ids.kube_event(saga.saga_id, saga.sequence, saga.attempt),
        reason=EVENT_REASON,
        message=message[:1024],
        warning=transition.to_state in _WARNING_STATES,
    )
    return (event,)
