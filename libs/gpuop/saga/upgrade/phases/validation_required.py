"""validation-required: climb the validation ladder for the new drivers (the policy's
`upgradePolicy.validation` rungs: NVML per component, a CUDA context on every GPU,
nvidia_peermem on the RDMA core, a GPU pod on the cordoned node), or, after a rollback,
check each restored driver with NVML; only then is the node uncordoned.

Each rung is a step with its own deadline; a rung that fails or runs out of time
compensates like any step after the unload (`compensation.fail`: rollback, when allowed).
The driver-manager answers the driver rungs (`ValidateDriver` with its `check`); the
orchestrator runs the pod (`RunValidationPod`) and reports how it ended. The operands were
paused for the reload, and a paused device plugin advertises every GPU Unhealthy, so the first
pod rung (`pod` or `preflight`) resumes them first (`validate-resume`); a rollback after that
pauses them again before it unloads anything (rollback-required). The preflight rung's
diagnostic holds every GPU of the node and fails with its last log lines."""

from __future__ import annotations

from gpuop.events import device as dev
from gpuop.events import driver as dm
from gpuop.events import kube
from gpuop.events.driver import Component
from gpuop.events.upgrade import UpgradeState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import operands
from gpuop.saga.actions import RunValidationPod, preflight_pod
from gpuop.saga.machine import Effects, StepResult, Trigger
from gpuop.saga.upgrade import compensation
from gpuop.saga.upgrade.drafting import Draft
from gpuop.saga.upgrade.effects import action_id, driver_effects, issue, timeout
from gpuop.saga.upgrade.phases.common import answers_step, fail_on_deadline, on_driver_result
from gpuop.saga.upgrade.records import NodeSaga
from gpuop.saga.upgrade.steps import Step, StepKind, after, validation_plan

STATE = S.VALIDATION_REQUIRED


def _plan(draft: Draft) -> tuple[tuple[Step, ...], bool]:
    saga = draft.saga
    rollback = saga.failure is not None
    components: tuple[Component, ...] = saga.rolled_back if rollback else saga.components
    ladder = draft.policy.validation
    return validation_plan(components, rollback, ladder, bool(saga.operands)), rollback


def enter(draft: Draft, retry: bool) -> None:
    draft.start(_plan(draft)[0][0])


def _next_step(draft: Draft) -> None:
    saga = draft.saga
    plan, rollback = _plan(draft)
    following = after(plan, saga.step)
    if following is not None:
        if following.kind is StepKind.VALIDATE_RESUME:
            # from here a rollback must pause them again (rollback-required does)
            draft.update(operands_paused=False, paused=())
        draft.start(following)
    elif rollback:
        unrestored = tuple(c for c in saga.touched if c not in saga.rolled_back)
        draft.update(touched=unrestored)
        if unrestored:
            names = ", ".join(unrestored)
            compensation.give_up(draft, f"no previous version of {names} to restore")
        else:
            draft.move(S.UNCORDON_REQUIRED, "previous drivers validated")
    else:
        draft.update(touched=())
        draft.move(S.UNCORDON_REQUIRED, "new drivers validated")


def _on_pod(draft: Draft, trigger: Trigger) -> None:
    if not answers_step(draft, trigger):
        return
    token = draft.saga.step.token
    if isinstance(trigger, kube.ValidationPodFailed):
        detail = f"{token}: pod {trigger.pod} {trigger.reason}: {trigger.message}"
        compensation.fail(draft, detail.rstrip(": "), StepResult.FAILED)
    elif isinstance(trigger, kube.ValidationPodSucceeded):
        draft.outcome(StepResult.SUCCEEDED, f"pod {trigger.pod} Succeeded")
        _next_step(draft)


def _rung_failed(draft: Draft, failure: dm.DriverFailure, detail: str) -> None:
    """A driver rung failed: the reason names the rung's step and the failure's reason."""
    reason = getattr(failure, "reason", None)
    named = f"{draft.saga.step.token} ({reason}): {detail}" if reason else detail
    compensation.fail(draft, named, StepResult.FAILED)


def _on_resumed(draft: Draft, trigger: Trigger) -> None:
    # `paused` counts the confirmations of this resume, as the pause step counts its own
    if operands.count(draft, trigger, dev.OperandResumed):
        draft.update(paused=())
        draft.outcome(StepResult.SUCCEEDED, "every operand resumed")
        _next_step(draft)


def on_event(draft: Draft, trigger: Trigger) -> None:
    kind = draft.saga.step.kind
    if kind in (StepKind.VALIDATE_POD, StepKind.VALIDATE_PREFLIGHT):
        _on_pod(draft, trigger)
    elif kind is StepKind.VALIDATE_RESUME:
        _on_resumed(draft, trigger)
    else:
        on_driver_result(draft, trigger, _next_step, _rung_failed)


on_deadline = fail_on_deadline


def effects(saga: NodeSaga, spec: GPUClusterPolicySpec) -> Effects:
    """A driver rung's `ValidateDriver`, the operands' resume before the pods, or the pod
    rung's or the preflight rung's `RunValidationPod`."""
    if saga.step.kind is StepKind.VALIDATE_RESUME:
        resume = dev.ResumeOperands(reason=f"validation pod of {saga.rollout_id}")
        return (issue(saga, resume, saga.step.token),), ()
    if saga.step.kind is StepKind.VALIDATE_PREFLIGHT:
        limit = timeout(saga, spec.upgrade_policy)
        return (), (preflight_pod(action_id(saga, saga.step.token), spec, limit),)
    if saga.step.kind is not StepKind.VALIDATE_POD:
        return driver_effects(saga, spec)
    pod = spec.upgrade_policy.validation.pod
    run = RunValidationPod(
        id=action_id(saga, saga.step.token),
        image=pod.image,
        command=pod.command,
        namespace=pod.namespace,
        runtime_class_name=pod.runtime_class_name,
        timeout_seconds=timeout(saga, spec.upgrade_policy),
    )
    return (), (run,)
