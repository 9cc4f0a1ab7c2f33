"""remediation-failed: the node stays marked (`GPUHealthy` False with the reason, the taint
when the policy quarantines; on a DRA node the faulty GPUs' DeviceTaintRules, so no new
claim gets a GPU whose remediation failed, while the node's other GPUs serve on) for a
person to look at; operands paused for the remediation resume, so the node's other GPUs go
back to work (the device plugin keeps the bad one Unhealthy)."""

from __future__ import annotations

from gpuop.events import device as dev
from gpuop.events.remediation import RemediationState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.machine import Effects, IssuedCommand, ignore
from gpuop.saga.remediation.actions import MirrorHealth
from gpuop.saga.remediation.drafting import Draft
from gpuop.saga.remediation.phases.common import (
    action_id,
    issue,
    quarantined_devices,
    unhealthy_of,
)
from gpuop.saga.remediation.records import RemediationSaga, Step

STATE = S.FAILED


def enter(draft: Draft, retry: bool) -> None:
    draft.start(Step(name="failed"))


on_event = ignore
on_deadline = ignore


def effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    mirror = MirrorHealth(
        id=action_id(saga, "failed"),
        unhealthy=unhealthy_of(saga),
        taint=True if spec.remediation.quarantine else None,
        detail=f"remediation failed: {saga.failure}",
        devices=quarantined_devices(saga),
    )
    commands: tuple[IssuedCommand, ...] = ()
    if saga.operands_paused:
        resume = dev.ResumeOperands(reason=f"GPU remediation {saga.saga_id} failed")
        commands = (issue(saga, resume, "failed-resume"),)
    return commands, (mirror,)
