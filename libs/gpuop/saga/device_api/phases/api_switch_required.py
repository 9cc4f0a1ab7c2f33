"""api-switch-required: the device plugin serves the GPUs through the API wanted
(`SetDeviceApi`): it stops advertising `nvidia.com/gpu` and starts the DRA kubelet plugin,
or the other way round, and answers `DeviceApiApplied` once the kubelet registered the
plugin. For DRA, the cluster role publishes the node's ResourceSlice on that answer; the
validation that follows proves it (a claim is allocated only from a published slice).

An answer not serving the API (the kubelet refused the plugin), or none by the deadline,
switches back: the plugin may have half changed."""

from __future__ import annotations

from gpuop.events.device_api_commands import SetDeviceApi
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.device_api.drafting import Draft, issue
from gpuop.saga.device_api.phases.common import applied, fail_on_deadline, refusal, start
from gpuop.saga.device_api.records import DeviceApiSaga, StepResult, SwitchStepKind
from gpuop.saga.device_api.states import DeviceApiState as S
from gpuop.saga.machine import Effects, Trigger

STATE = S.API_SWITCH_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    draft.update(switched=True)
    start(draft, SwitchStepKind.SWITCH)


def on_event(draft: Draft, trigger: Trigger) -> None:
    api = draft.saga.api
    answer = applied(draft, trigger, api)
    if answer is True:
        draft.outcome(StepResult.SUCCEEDED, f"the kubelet serves the GPUs through {api}")
        draft.move(S.VALIDATION_REQUIRED, f"DeviceApiApplied: {api} serving")
    elif answer is False:
        draft.fail(refusal(trigger))


on_deadline = fail_on_deadline


def effects(saga: DeviceApiSaga, spec: GPUClusterPolicySpec) -> Effects:
    command = SetDeviceApi(api=saga.api, reason=saga.reason or f"policy deviceAPI: {saga.api}")
    return (issue(saga, command),), ()
