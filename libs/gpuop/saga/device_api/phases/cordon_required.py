"""cordon-required: the node is made unschedulable, so no new pod lands on it while its
GPUs change API. A node someone cordoned before stays cordoned at the end
(`was_unschedulable`). A cordon not confirmed by its deadline fails the switch, nothing
else done."""

from __future__ import annotations

from gpuop.events import kube
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.actions import Cordon
from gpuop.saga.device_api.drafting import Draft, action_id
from gpuop.saga.device_api.phases.common import answers_action, fail_on_deadline, start
from gpuop.saga.device_api.records import DeviceApiSaga, StepResult, SwitchStepKind
from gpuop.saga.device_api.states import DeviceApiState as S
from gpuop.saga.machine import Effects, Trigger

STATE = S.CORDON_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    start(draft, SwitchStepKind.CORDON)


def on_event(draft: Draft, trigger: Trigger) -> None:
    if isinstance(trigger, kube.NodeCordoned) and answers_action(draft, trigger):
        draft.update(cordoned=True, was_unschedulable=trigger.was_unschedulable)
        before = " (cordoned before: it stays so)" if trigger.was_unschedulable else ""
        draft.outcome(StepResult.SUCCEEDED, f"cordoned{before}")
        draft.move(S.DRAIN_REQUIRED, f"cordoned{before}")


on_deadline = fail_on_deadline


def effects(saga: DeviceApiSaga, spec: GPUClusterPolicySpec) -> Effects:
    return (), (Cordon(id=action_id(saga)),)
