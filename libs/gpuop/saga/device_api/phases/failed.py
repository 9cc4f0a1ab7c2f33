"""device-api-failed: the switch failed; its reason is the transition's, the node's Event
and `DeviceApiSaga.failure`. Final: not retried by itself; the next difference between the
policy and what the node serves (a policy change, the device plugin's next answer) starts
a new switch."""

from __future__ import annotations

from gpuop.saga.device_api.drafting import Draft
from gpuop.saga.device_api.records import SwitchStep, SwitchStepKind
from gpuop.saga.device_api.states import DeviceApiState as S
from gpuop.saga.machine import ignore, no_effects

STATE = S.FAILED


def enter(draft: Draft, retry: bool) -> None:
    draft.take(SwitchStep(kind=SwitchStepKind.FAILED))


on_event = ignore
on_deadline = ignore
effects = no_effects
