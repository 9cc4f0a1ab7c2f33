"""holders-eviction-required: only the pods holding a GPU being re-carved are evicted.

Two steps: the device plugin names the holders of the re-carved GPUs (`ListGpuHolders`,
from its allocations and the kubelet's PodResources), then those pods, and no others, are
evicted (`EvictPods`). No holder: nothing to evict, the eviction is recorded as skipped.
A listing the device plugin cannot give (`GpuHoldersUnknown`) fails the request rather than
apply under pods it cannot see; an eviction that fails (a PodDisruptionBudget, pods without
a controller and `force` off) fails it too. Either way the operands are resumed.
"""

from __future__ import annotations

from gpuop.events import kube
from gpuop.events import remediation_commands as rem
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.machine import Effects, StepResult, Trigger
from gpuop.saga.mig.actions import EvictPods
from gpuop.saga.mig.drafting import Draft, action_id, issue
from gpuop.saga.mig.phases.common import (
    answers,
    answers_action,
    fail_on_deadline,
    start,
    timeout,
)
from gpuop.saga.mig.records import MigSaga, MigStep, MigStepKind
from gpuop.saga.mig.states import MigState as S

STATE = S.HOLDERS_EVICTION_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    start(draft, MigStepKind.LIST_HOLDERS)


def on_event(draft: Draft, trigger: Trigger) -> None:
    kind = draft.saga.step.kind
    if kind is MigStepKind.LIST_HOLDERS:
        _on_listing(draft, trigger)
    elif kind is MigStepKind.EVICT_HOLDERS and answers_action(draft, trigger):
        _on_eviction(draft, trigger)


def _on_listing(draft: Draft, trigger: Trigger) -> None:
    if isinstance(trigger, rem.GpuHoldersUnknown) and answers(draft, trigger.command_id):
        detail = f"the device plugin cannot tell which pods hold the GPUs: {trigger.message}"
        draft.fail(detail.rstrip(": "))
        return
    if not isinstance(trigger, rem.GpuHoldersListed) or not answers(draft, trigger.command_id):
        return
    pods = tuple(trigger.pods)
    draft.update(holders=pods)
    draft.outcome(StepResult.SUCCEEDED, f"{len(pods)} pod(s) hold the re-carved GPUs")
    if pods:
        start(draft, MigStepKind.EVICT_HOLDERS)
        return
    step = MigStep(kind=MigStepKind.EVICT_HOLDERS)
    draft.skip(step, S.APPLY_REQUIRED, StepResult.SKIPPED, "no pod holds the re-carved GPUs")


def _on_eviction(draft: Draft, trigger: Trigger) -> None:
    if isinstance(trigger, kube.PodsDeleted):
        draft.outcome(StepResult.SUCCEEDED, f"{trigger.deleted} pod(s) evicted")
        draft.move(S.APPLY_REQUIRED, "the pods of the re-carved GPUs are gone")
    elif isinstance(trigger, kube.PodDeletionFailed):
        left = ", ".join(str(pod) for pod in trigger.pods[:8])
        detail = f"pods of the re-carved GPUs stayed ({trigger.reason}): {left} {trigger.message}"
        draft.fail(detail.strip().rstrip(":"))


on_deadline = fail_on_deadline


def effects(saga: MigSaga, spec: GPUClusterPolicySpec) -> Effects:
    token = saga.step.token
    if saga.step.kind is MigStepKind.LIST_HOLDERS:
        gpus = tuple(gpu.uuid for gpu in saga.plan.recarved)
        return (issue(saga, rem.ListGpuHolders(gpu_uuids=gpus), token),), ()
    eviction = spec.mig.eviction
    evict = EvictPods(
        id=action_id(saga, token),
        pods=saga.holders,
        force=eviction.force,
        delete_empty_dir=eviction.delete_empty_dir,
        timeout_seconds=timeout(saga, spec),
    )
    return (), (evict,)
