"""What several device-API phases share: a deadline that fails the step, an answer to the
step, the executor's timeout, and the switch's answer."""

from __future__ import annotations

from gpuop.events import kube
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.device_api_commands import DeviceApi, DeviceApiApplied
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.device_api.drafting import Draft
from gpuop.saga.device_api.records import DeviceApiSaga, StepResult, SwitchStep, SwitchStepKind
from gpuop.saga.device_api.steps import limit_seconds
from gpuop.saga.machine import Trigger, overdue
from gpuop.saga.upgrade.steps import executor_timeout


def fail_on_deadline(draft: Draft, expired: DeadlineExpired) -> None:
    """Most steps' deadline: the step failed; compensate."""
    draft.fail(overdue(draft), StepResult.EXPIRED)


def answers_action(draft: Draft, trigger: Trigger) -> bool:
    """Whether `trigger` is the outcome of the Kubernetes action of the pending step."""
    return isinstance(trigger, kube.KubeActionResult) and trigger.action_id == draft.step_id()


def applied(draft: Draft, trigger: Trigger, api: DeviceApi) -> bool | None:
    """What the device plugin's answer to the pending `SetDeviceApi` says: True when it
    serves `api`, False when it does not (the reason then recorded), None when `trigger` is
    no answer to it (another command's, or a change of the plugin's own)."""
    if not isinstance(trigger, DeviceApiApplied) or trigger.command_id != draft.step_id():
        return None
    return trigger.serving and trigger.api is api


def refusal(trigger: Trigger) -> str:
    """The device plugin's answer that does not serve what was asked, in words."""
    if not isinstance(trigger, DeviceApiApplied):
        raise TypeError(f"not a DeviceApiApplied: {type(trigger).__name__}")
    serving = "serving" if trigger.serving else "not serving"
    return f"the device plugin answered {trigger.api} {serving}: {trigger.message}".rstrip(": ")


def timeout(saga: DeviceApiSaga, spec: GPUClusterPolicySpec) -> int:
    """The executor's timeout for the pending step: 90% of its deadline, so it reports its
    own failure, with its reason, before the saga's deadline fails the step."""
    limit = limit_seconds(saga.step, spec.upgrade_policy)
    if limit is None:
        raise ValueError(f"step {saga.step.token} has no deadline to take a timeout from")
    return executor_timeout(limit)


def start(draft: Draft, kind: SwitchStepKind) -> None:
    """Make a step of `kind` the pending one."""
    draft.start(SwitchStep(kind=kind))
