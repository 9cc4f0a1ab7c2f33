"""device-api-done: the node serves its GPUs through the API the policy wants; final."""

from __future__ import annotations

from gpuop.saga.device_api.drafting import Draft
from gpuop.saga.device_api.records import SwitchStep, SwitchStepKind
from gpuop.saga.device_api.states import DeviceApiState as S
from gpuop.saga.machine import ignore, no_effects

STATE = S.DONE


def enter(draft: Draft, retry: bool) -> None:
    draft.take(SwitchStep(kind=SwitchStepKind.DONE))


on_event = ignore
on_deadline = ignore
effects = no_effects
