"""gpu-holders-required: the device plugin names the pods holding the affected GPUs (from
its allocations and the kubelet's PodResources); when it cannot, every GPU pod goes."""

from __future__ import annotations

from gpuop.events import remediation_commands as cmd
from gpuop.events.remediation import RemediationState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.machine import Effects, Trigger
from gpuop.saga.remediation.drafting import Draft
from gpuop.saga.remediation.phases.common import fail_on_deadline, issue
from gpuop.saga.remediation.records import RemediationSaga, Step

STATE = S.HOLDERS_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    draft.start(Step(name="holders"))


def on_event(draft: Draft, trigger: Trigger) -> None:
    if not isinstance(trigger, cmd.GpuHoldersListed | cmd.GpuHoldersUnknown):
        return
    if trigger.command_id != draft.step_id():
        return
    if isinstance(trigger, cmd.GpuHoldersUnknown):
        draft.update(holders_unknown=True)
        draft.outcome_ok(f"holders unknown ({trigger.message}): every GPU pod goes")
        draft.move(S.EVICTION_REQUIRED, "the holders are unknown")
        return
    draft.update(holders=trigger.pods)
    draft.outcome_ok(f"{len(trigger.pods)} pods hold the GPUs")
    if trigger.pods:
        draft.move(S.EVICTION_REQUIRED, f"{len(trigger.pods)} pods hold the GPUs")
    else:
        draft.move(S.OPERANDS_PAUSE_REQUIRED, "no pod holds the GPUs")


on_deadline = fail_on_deadline


def effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    return (issue(saga, cmd.ListGpuHolders(gpu_uuids=saga.gpu_uuids)),), ()
