"""remediation-admission-required: the node quarantined, the remediation waits for a slot of
the one `maxUnavailable` budget (the runtime's admission pass records `NodeAdmitted`)."""

from __future__ import annotations

from gpuop.events.remediation import RemediationState as S
from gpuop.saga.machine import Admitted, Trigger, ignore
from gpuop.saga.remediation.drafting import Draft
from gpuop.saga.remediation.phases.common import quarantine
from gpuop.saga.remediation.records import Step

STATE = S.ADMISSION_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    draft.update(quarantined_devices=draft.saga.quarantining())  # the next attempt's GPUs
    draft.start(Step(name="admission"))


def on_event(draft: Draft, trigger: Trigger) -> None:
    if isinstance(trigger, Admitted):
        draft.outcome_ok("admitted")
        draft.move(S.HOLDERS_REQUIRED, "admitted under maxUnavailable")


on_deadline = ignore
effects = quarantine
