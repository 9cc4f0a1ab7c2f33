"""device-api-switch-required: the switch waits for a slot under the shared
`maxUnavailable` budget; an admission cordons the node."""

from __future__ import annotations

from gpuop.saga.device_api.drafting import Draft
from gpuop.saga.device_api.phases.common import start
from gpuop.saga.device_api.records import StepResult, SwitchStepKind
from gpuop.saga.device_api.states import DeviceApiState as S
from gpuop.saga.machine import Admitted, Trigger, ignore, no_effects

STATE = S.SWITCH_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    start(draft, SwitchStepKind.ADMISSION)


def on_event(draft: Draft, trigger: Trigger) -> None:
    if isinstance(trigger, Admitted):
        draft.outcome(StepResult.SUCCEEDED, "admitted")
        saga = draft.saga
        draft.move(S.CORDON_REQUIRED, f"admitted: switching {saga.previous} -> {saga.api}")


on_deadline = ignore
"""Admission has no deadline."""
effects = no_effects
