"""gpu-pods-eviction-required: the pods holding the GPUs, and only those, are evicted
(`upgradePolicy.podDeletion`'s force and emptyDir rules, PDBs honoured); when their holders
are unknown, every GPU pod of the node (the upgrade's `DeletePods` for the GPU)."""

from __future__ import annotations

from gpuop.events import driver as dm
from gpuop.events import kube
from gpuop.events.remediation import RemediationState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import actions as upgrade_actions
from gpuop.saga.machine import Effects, Trigger
from gpuop.saga.remediation.actions import EvictPods
from gpuop.saga.remediation.drafting import Draft
from gpuop.saga.remediation.phases.common import (
    action_id,
    answers_action,
    fail_on_deadline,
    timeout,
)
from gpuop.saga.remediation.records import RemediationSaga, Step

STATE = S.EVICTION_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    draft.start(Step(name="evict"))


def on_event(draft: Draft, trigger: Trigger) -> None:
    if not answers_action(draft, trigger):
        return
    if isinstance(trigger, kube.PodDeletionFailed):
        draft.fail(f"evict: {trigger.reason}: {trigger.message}")
    elif isinstance(trigger, kube.PodsDeleted):
        draft.outcome_ok(f"{trigger.deleted} pods evicted")
        draft.move(S.OPERANDS_PAUSE_REQUIRED, "the holders are gone")


on_deadline = fail_on_deadline


def effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    rules = spec.upgrade_policy.pod_deletion
    seconds = timeout(saga, spec)
    if saga.holders_unknown:
        every = upgrade_actions.DeletePods(
            id=action_id(saga), components=(dm.Component.GPU,), force=rules.force,
            timeout_seconds=seconds, delete_empty_dir=rules.delete_empty_dir,
        )  # fmt: skip
        return (), (every,)
    evict = EvictPods(
        id=action_id(saga), pods=saga.holders, force=rules.force, timeout_seconds=seconds,
        delete_empty_dir=rules.delete_empty_dir,
    )  # fmt: skip
    return (), (evict,)
