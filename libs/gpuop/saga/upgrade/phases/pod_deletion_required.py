"""pod-deletion-required: the pods holding the upgraded components' devices are to be gone;
if some stay, drain instead (when drain is enabled) or fail.

Which pods those are depends on the components the saga upgrades (`DeletePods.components`):
a GPU-only upgrade leaves a pod that holds only an RDMA device running, an OFED upgrade
deletes it before the NIC driver is unloaded under it."""

from __future__ import annotations

from gpuop.events import kube
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.upgrade import UpgradeState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.actions import DeletePods
from gpuop.saga.machine import Effects, StepResult, Trigger, overdue
from gpuop.saga.upgrade import compensation
from gpuop.saga.upgrade.drafting import Draft
from gpuop.saga.upgrade.effects import action_id, timeout
from gpuop.saga.upgrade.phases.common import BROUGHT_UP, answers_step, start_or_pass
from gpuop.saga.upgrade.records import NodeSaga
from gpuop.saga.upgrade.steps import StepKind

STATE = S.POD_DELETION_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    needed = not draft.saga.bring_up
    start_or_pass(draft, StepKind.POD_DELETION, needed, S.DRAIN_REQUIRED, BROUGHT_UP)


def on_event(draft: Draft, trigger: Trigger) -> None:
    if not answers_step(draft, trigger):
        return
    if isinstance(trigger, kube.PodsDeleted):
        draft.outcome(StepResult.SUCCEEDED, f"{trigger.deleted} GPU pods deleted")
        draft.move(S.DRAIN_REQUIRED, "GPU pods deleted")
        return
    if not isinstance(trigger, kube.PodDeletionFailed):
        return
    detail = f"GPU pods stayed ({trigger.reason}): {trigger.message}".rstrip(": ")
    _drain_instead(draft, detail, StepResult.FAILED)


def on_deadline(draft: Draft, expired: DeadlineExpired) -> None:
    _drain_instead(draft, overdue(draft), StepResult.EXPIRED)


def _drain_instead(draft: Draft, detail: str, result: StepResult) -> None:
    """The GPU pods stayed: drain the node when the policy drains, else the upgrade fails."""
    if draft.policy.drain.enable:
        draft.outcome(result, detail)
        draft.move(S.DRAIN_REQUIRED, f"{detail}; draining instead")
    else:
        compensation.fail(draft, detail, result)


def effects(saga: NodeSaga, spec: GPUClusterPolicySpec) -> Effects:
    deletion = spec.upgrade_policy.pod_deletion
    pods = DeletePods(
        id=action_id(saga, saga.step.token),
        components=saga.components,
        force=deletion.force,
        timeout_seconds=timeout(saga, spec.upgrade_policy),
        delete_empty_dir=deletion.delete_empty_dir,
    )
    return (), (pods,)
