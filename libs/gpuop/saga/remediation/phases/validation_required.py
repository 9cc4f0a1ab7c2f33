"""validation-required: the validation ladder (`remediation.rungs`, else
`upgradePolicy.validation`'s) for the driver the node runs: NVML, a CUDA context on every GPU,
the operands resumed, a GPU pod on the still-quarantined node, and the admin's diagnostic
holding every GPU of it (`preflight`, with its own deadline); each rung a step with its
deadline, any failure fails the remediation (there is no other driver to roll back to), a
failed diagnostic with its last log lines as the reason."""

from __future__ import annotations

from gpuop.events import device as dev
from gpuop.events import dra, kube
from gpuop.events import driver as dm
from gpuop.events.remediation import RemediationState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import actions as upgrade_actions
from gpuop.saga.machine import Effects, Trigger
from gpuop.saga.remediation.drafting import Draft
from gpuop.saga.remediation.phases.common import (
    action_id,
    answers_action,
    fail_on_deadline,
    issue,
    on_operands,
    timeout,
)
from gpuop.saga.remediation.records import RemediationSaga, Step

STATE = S.VALIDATION_REQUIRED
RESUME = "validate-resume"
POD = "validate-pod"
PREFLIGHT = "validate-preflight"


def plan(spec: GPUClusterPolicySpec, operands_paused: bool) -> tuple[str, ...]:
    """The rungs' step tokens, in order (peermem is an OFED upgrade's rung, not run here)."""
    tokens: list[str] = []
    for rung in spec.upgrade_policy.validation.ladder(spec.remediation.rungs):
        if rung == "nvml":
            tokens.append("validate-gpu")
        elif rung == "cuda":
            tokens.append("validate-cuda-gpu")
        elif rung in ("pod", "preflight"):
            if operands_paused and RESUME not in tokens:
                tokens.append(RESUME)
            tokens.append(POD if rung == "pod" else PREFLIGHT)
    return tuple(tokens)


def enter(draft: Draft, retry: bool) -> None:
    if draft.saga.driver_version is None:
        draft.fail("no GPU driver version known to validate")
        return
    draft.update(paused=())
    draft.start(Step(name=plan(draft.spec, draft.saga.operands_paused)[0]))


def _next_rung(draft: Draft) -> None:
    saga = draft.saga
    tokens = plan(draft.spec, True)
    index = tokens.index(saga.step.name) if saga.step.name in tokens else len(tokens)
    following = [t for t in tokens[index + 1 :] if t != RESUME or saga.operands_paused]
    if following:
        draft.start(Step(name=following[0]))
    else:
        draft.move(S.RELEASE_REQUIRED, "the GPUs validated")


def _resumed(draft: Draft) -> None:
    draft.update(operands_paused=False)
    draft.outcome_ok("every operand resumed")
    _next_rung(draft)


def _on_pod(draft: Draft, trigger: Trigger) -> None:
    if not answers_action(draft, trigger):
        return
    if isinstance(trigger, kube.ValidationPodFailed):
        name = draft.saga.step.name
        draft.fail(f"{name}: pod {trigger.pod} {trigger.reason}: {trigger.message}")
    elif isinstance(trigger, kube.ValidationPodSucceeded):
        draft.outcome_ok(f"pod {trigger.pod} Succeeded")
        _next_rung(draft)


def _on_driver(draft: Draft, trigger: Trigger) -> None:
    if not isinstance(trigger, dm.DriverValidated | dm.DriverValidationFailed):
        return
    if trigger.command_id != draft.step_id():
        return
    if isinstance(trigger, dm.DriverValidationFailed):
        name = draft.saga.step.name
        draft.fail(f"{name} ({trigger.reason}): {trigger.message}".rstrip(": "))
        return
    draft.outcome_ok(f"{trigger.devices} GPUs validated")
    _next_rung(draft)


def on_event(draft: Draft, trigger: Trigger) -> None:
    name = draft.saga.step.name
    if name == RESUME:
        on_operands(draft, trigger, dev.OperandResumed, _resumed)
    elif name in (POD, PREFLIGHT):
        _on_pod(draft, trigger)
    else:
        _on_driver(draft, trigger)


MIG_DEVICE = "-mig-"
"""What the name of a MIG device of NVIDIA's DRA driver has in it (`gpu-0-mig-1g18gb-19-0`)."""

on_deadline = fail_on_deadline


def effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    name = saga.step.name
    if name == RESUME:
        return (issue(saga, dev.ResumeOperands(reason=f"validation of {saga.saga_id}")),), ()
    if name == PREFLIGHT:
        return (), (upgrade_actions.preflight_pod(action_id(saga), spec, timeout(saga, spec)),)
    if name == POD:
        pod = spec.upgrade_policy.validation.pod
        # a device quarantine validates the GPUs it reset: a claim for exactly them, through
        # their quarantine taint (the node's other GPUs serve meanwhile). A GPU in MIG mode
        # has no whole-GPU device: its pod asks as any DRA node's (the executor's look-up)
        reset = [d for gpu in saga.gpu_uuids for d in saga.dra_devices.get(gpu, ())]
        quarantine = bool(reset) and not any(MIG_DEVICE in device for device in reset)
        run = upgrade_actions.RunValidationPod(
            id=action_id(saga), image=pod.image, command=pod.command, namespace=pod.namespace,
            runtime_class_name=pod.runtime_class_name, timeout_seconds=timeout(saga, spec),
            device_class=dra.DRIVER if quarantine else "",
            gpu_uuids=saga.gpu_uuids if quarantine else (),
        )  # fmt: skip
        return (), (run,)
    if saga.driver_version is None:
        raise ValueError("no GPU driver version to validate")
    check = dm.ValidationCheck.CUDA if name == "validate-cuda-gpu" else dm.ValidationCheck.NVML
    validate = dm.ValidateDriver(
        component=dm.Component.GPU, version=saga.driver_version,
        expected_devices=saga.expected_devices, timeout_seconds=timeout(saga, spec), check=check,
    )  # fmt: skip
    return (issue(saga, validate),), ()
