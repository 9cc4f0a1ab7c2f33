"""validation-required: a pod given one GPU through the API now served runs to success on
the cordoned node (`upgradePolicy.validation.pod`'s image and command). Through DRA the
pod holds a ResourceClaim for one device of the DeviceClass `gpu.nvidia.com`, so the
scheduler must allocate it from the node's slice and the kubelet plugin prepare it; through
the device plugin it requests one `nvidia.com/gpu`, as the upgrade's pod rung does. A pod
that fails, or none done by the deadline, switches back."""

from __future__ import annotations

from gpuop.events import dra, kube
from gpuop.events.device_api_commands import DeviceApi
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.actions import RunValidationPod
from gpuop.saga.device_api.drafting import Draft, action_id
from gpuop.saga.device_api.phases.common import answers_action, fail_on_deadline, start, timeout
from gpuop.saga.device_api.records import DeviceApiSaga, StepResult, SwitchStepKind
from gpuop.saga.device_api.states import DeviceApiState as S
from gpuop.saga.machine import Effects, Trigger

STATE = S.VALIDATION_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    start(draft, SwitchStepKind.VALIDATE)


def on_event(draft: Draft, trigger: Trigger) -> None:
    if not answers_action(draft, trigger):
        return
    if isinstance(trigger, kube.ValidationPodSucceeded):
        draft.outcome(StepResult.SUCCEEDED, f"{trigger.pod} succeeded")
        draft.move(S.UNCORDON_REQUIRED, f"a pod given a GPU through {draft.saga.api} succeeded")
    elif isinstance(trigger, kube.ValidationPodFailed):
        draft.fail(f"the validation pod {trigger.pod} {trigger.reason}: {trigger.message}")


on_deadline = fail_on_deadline


def effects(saga: DeviceApiSaga, spec: GPUClusterPolicySpec) -> Effects:
    pod = spec.upgrade_policy.validation.pod
    run = RunValidationPod(
        id=action_id(saga), image=pod.image, command=pod.command, namespace=pod.namespace,
        runtime_class_name=pod.runtime_class_name, timeout_seconds=timeout(saga, spec),
        device_class=dra.DRIVER if saga.api is DeviceApi.DRA else "",
    )  # fmt: skip
    return (), (run,)
