"""drain-required: the pods holding the node's GPUs are evicted, whichever API gave them
their GPUs: those requesting `nvidia.com/gpu` (or MIG) resources and those whose
ResourceClaims hold GPUs (`gpuop.kube.pods.holds`, the upgrade's pod deletion, with
`upgradePolicy.podDeletion`'s force and emptyDir rules). A pod left behind would keep a GPU
the other API is about to hand out again. Pods that stay fail the switch (uncordoned)."""

from __future__ import annotations

from gpuop.events import kube
from gpuop.events.driver import Component
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.actions import DeletePods
from gpuop.saga.device_api.drafting import Draft, action_id
from gpuop.saga.device_api.phases.common import answers_action, fail_on_deadline, start, timeout
from gpuop.saga.device_api.records import DeviceApiSaga, StepResult, SwitchStepKind
from gpuop.saga.device_api.states import DeviceApiState as S
from gpuop.saga.machine import Effects, Trigger

STATE = S.DRAIN_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    start(draft, SwitchStepKind.DRAIN)


def on_event(draft: Draft, trigger: Trigger) -> None:
    if not answers_action(draft, trigger):
        return
    if isinstance(trigger, kube.PodsDeleted):
        draft.outcome(StepResult.SUCCEEDED, f"{trigger.deleted} GPU pod(s) evicted")
        draft.move(S.API_SWITCH_REQUIRED, "no pod holds a GPU of the node")
    elif isinstance(trigger, kube.PodDeletionFailed):
        left = ", ".join(str(pod) for pod in trigger.pods[:8])
        detail = f"GPU pods stayed ({trigger.reason}): {left} {trigger.message}"
        draft.fail(detail.strip().rstrip(":"))


on_deadline = fail_on_deadline


def effects(saga: DeviceApiSaga, spec: GPUClusterPolicySpec) -> Effects:
    deletion = spec.upgrade_policy.pod_deletion
    delete = DeletePods(
        id=action_id(saga),
        components=(Component.GPU,),
        force=deletion.force,
        timeout_seconds=timeout(saga, spec),
        delete_empty_dir=deletion.delete_empty_dir,
    )
    return (), (delete,)
