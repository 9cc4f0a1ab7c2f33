"""remediation-done: the node released: `GPUHealthy` True, the taint removed."""

from __future__ import annotations

from gpuop.events.remediations import RemediationState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.machine import Effects, ignore
from gpuop.saga.remediation.actions import MirrorHealth
from gpuop.saga.remediation.drafting import Draft
from gpuop.saga.remediation.phases.common import action_id
from gpuop.saga.remediation.records import RemediationSaga, Step

STATE = S.DONE


def enter(draft: Draft, retry: bool) -> None:
    draft.start(Step(name="done"))


on_event = ignore
on_deadline = ignore


def effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    return (), (MirrorHealth(id=action_id(saga, "release"), unhealthy=(), taint=False),)
