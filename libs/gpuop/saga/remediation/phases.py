"""The remediation's phases: each state's behaviour (enter, on_event, on_deadline, effects).

One section per state, in the order of the main line (`table`). Every wait has a deadline
from `remediation.deadlines`; every command and action an id from the saga id, the step and
the attempt (`ids.step`), so a step issued again after a crash is the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from gpuop.events import device as dev
from gpuop.events import driver as dm
from gpuop.events import hardware as hw
from gpuop.events import ids, kube
from gpuop.events import remediation as cmd
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.device import XidAction
from gpuop.events.remediations import RemediationState as S
from gpuop.events.upgrade import NodeUpgradeStateChanged, UpgradeState
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import actions as upgrade_actions
from gpuop.saga.machine import Admitted, Effects, IssuedCommand, Phase, Trigger, ignore
from gpuop.saga.remediation.actions import EVENT_REASON, EvictPods, MirrorHealth
from gpuop.saga.remediation.drafting import Draft
from gpuop.saga.remediation.records import RemediationSaga, Step
from gpuop.saga.steps import executor_timeout


class Result(StrEnum):
    """How a step ended, as the record's outcomes say it."""

    SKIPPED = "skipped"


_REBOOTING = frozenset({XidAction.REBOOT, XidAction.DRAIN_AND_REPLACE})


def issue(saga: RemediationSaga, payload: Any, token: str | None = None) -> IssuedCommand:
    token = token or saga.step.token
    return IssuedCommand(
        payload=payload, id=ids.step(saga.saga_id, token, saga.attempt), step=token,
        attempt=saga.attempt,
    )  # fmt: skip


def action_id(saga: RemediationSaga, token: str | None = None) -> str:
    return ids.step(saga.saga_id, token or saga.step.token, saga.attempt)


def unhealthy_of(saga: RemediationSaga) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(sorted(saga.unhealthy.items()))


def limit_seconds(saga: RemediationSaga, step: Step, spec: GPUClusterPolicySpec) -> float | None:
    """How long a step may take; None for the waits without a deadline."""
    deadlines = spec.remediation.deadlines
    name = step.name
    limits = {
        "holders": deadlines.holders,
        "evict": deadlines.eviction,
        "operands-pause": deadlines.operands_pause,
        "release": deadlines.operands_pause,
        "validate-resume": deadlines.operands_pause,
        "reset": deadlines.reset,
        "reboot": deadlines.reboot,
    }
    if name in limits:
        return float(limits[name])
    if name.startswith("validate-"):
        return float(deadlines.validation)
    return None


def _timeout(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> int:
    limit = limit_seconds(saga, saga.step, spec)
    return executor_timeout(limit if limit is not None else 60.0)


def _expired(draft: Draft, expired: DeadlineExpired) -> None:
    draft.fail(f"{draft.saga.step.token} did not finish in time", expired=True)


def _answers_action(draft: Draft, trigger: Trigger) -> bool:
    return isinstance(trigger, kube.KubeActionResult) and trigger.action_id == draft.step_id()


# remediation-admission-required: quarantined, waits for a slot


def _enter_admission(draft: Draft, retry: bool) -> None:
    draft.start(Step(name="admission"))


def _on_admission(draft: Draft, trigger: Trigger) -> None:
    if isinstance(trigger, Admitted):
        draft.outcome_ok("admitted")
        draft.move(S.HOLDERS_REQUIRED, "admitted under maxUnavailable")


def _quarantine(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    """The node marked: the condition False, the taint when the policy quarantines, an Event."""
    mirror = MirrorHealth(
        id=action_id(saga, "quarantine"),
        unhealthy=unhealthy_of(saga),
        taint=True if spec.remediation.quarantine else None,
    )
    gpus = ", ".join(saga.gpu_uuids)
    event = upgrade_actions.RecordEvent(
        id=action_id(saga, "quarantine-event"),
        reason=EVENT_REASON,
        message=f"GPU remediation {saga.saga_id} of {gpus} ({saga.action})"[:1024],
        warning=True,
    )
    return (), (mirror, event)


# gpu-holders-required: the device plugin names the pods holding the GPUs


def _enter_holders(draft: Draft, retry: bool) -> None:
    draft.start(Step(name="holders"))


def _on_holders(draft: Draft, trigger: Trigger) -> None:
    if isinstance(trigger, cmd.GpuHoldersListed | cmd.GpuHoldersUnknown):
        if trigger.command_id != draft.step_id():
            return
    else:
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


def _holders_effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    return (issue(saga, cmd.ListGpuHolders(gpu_uuids=saga.gpu_uuids)),), ()


# gpu-pods-eviction-required: those pods, and only those, evicted


def _enter_eviction(draft: Draft, retry: bool) -> None:
    draft.start(Step(name="evict"))


def _on_eviction(draft: Draft, trigger: Trigger) -> None:
    if not _answers_action(draft, trigger):
        return
    if isinstance(trigger, kube.PodDeletionFailed):
        draft.fail(f"evict: {trigger.reason}: {trigger.message}")
    elif isinstance(trigger, kube.PodsDeleted):
        draft.outcome_ok(f"{trigger.deleted} pods evicted")
        draft.move(S.OPERANDS_PAUSE_REQUIRED, "the holders are gone")


def _eviction_effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    rules = spec.upgrade_policy.pod_deletion
    timeout = _timeout(saga, spec)
    if saga.holders_unknown:
        every = upgrade_actions.DeletePods(
            id=action_id(saga), components=(dm.Component.GPU,), force=rules.force,
            timeout_seconds=timeout, delete_empty_dir=rules.delete_empty_dir,
        )  # fmt: skip
        return (), (every,)
    evict = EvictPods(
        id=action_id(saga), pods=saga.holders, force=rules.force, timeout_seconds=timeout,
        delete_empty_dir=rules.delete_empty_dir,
    )  # fmt: skip
    return (), (evict,)


# operands-pause-required: the operands release the GPUs


def _enter_pause(draft: Draft, retry: bool) -> None:
    draft.update(paused=(), operands_paused=bool(draft.saga.operands))
    draft.start(Step(name="operands-pause"))
    if not draft.saga.operands:
        draft.outcome_ok("no operands")
        _after_pause(draft)


def _after_pause(draft: Draft) -> None:
    if draft.saga.action in _REBOOTING:
        draft.reboot(f"the fault asks for a {draft.saga.action}")
    else:
        draft.move(S.RESET_REQUIRED, "operands released the GPUs")


def _on_pause(draft: Draft, trigger: Trigger) -> None:
    saga = draft.saga
    if not isinstance(trigger, dev.OperandPaused) or trigger.command_id != draft.step_id():
        return
    if trigger.service not in saga.operands or trigger.service in saga.paused:
        return
    paused = tuple(s for s in saga.operands if s in {*saga.paused, trigger.service})
    draft.update(paused=paused)
    if len(paused) == len(saga.operands):
        draft.update(paused=())
        draft.outcome_ok("every operand paused")
        _after_pause(draft)


def _pause_effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    pause = dev.PauseOperands(
        components=(dm.Component.GPU,), reason=f"GPU remediation {saga.saga_id}"
    )
    return (issue(saga, pause),), ()


# gpu-reset-required: the driver-manager resets the GPUs


def _enter_reset(draft: Draft, retry: bool) -> None:
    draft.start(Step(name="reset"))


def _on_reset(draft: Draft, trigger: Trigger) -> None:
    if not isinstance(trigger, cmd.GpuReset | cmd.GpuResetFailed):
        return
    if trigger.command_id != draft.step_id():
        return
    if isinstance(trigger, cmd.GpuReset):
        draft.outcome_ok(f"reset ({trigger.method})")
        draft.move(S.VALIDATION_REQUIRED, f"GPUs reset ({trigger.method})")
        return
    draft.reset_failed(f"GpuResetFailed {trigger.reason}: {trigger.message}".rstrip(": "))


def _reset_deadline(draft: Draft, expired: DeadlineExpired) -> None:
    draft.reset_failed("reset did not finish in time", expired=True)


def _reset_effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    reset = cmd.ResetGpu(
        gpu_uuids=saga.gpu_uuids,
        allow_driver_reload=spec.remediation.allow_driver_reload,
        timeout_seconds=_timeout(saga, spec),
    )
    return (issue(saga, reset),), ()


# reboot-required: only a new boot id confirms it


def _enter_reboot(draft: Draft, retry: bool) -> None:
    draft.start(Step(name="reboot"))


def _on_reboot(draft: Draft, trigger: Trigger) -> None:
    saga = draft.saga
    if not isinstance(trigger, kube.NodeObserved | hw.HardwareDiscovered) or not trigger.boot_id:
        return
    if trigger.boot_id == saga.boot_id_at_reboot:
        return
    # a fresh boot: the agents start unpaused only if no pause is pending in their commands,
    # so the release resumes them all the same
    draft.update(boot_id=trigger.boot_id, rebooted=True)
    draft.outcome_ok(f"new boot id {trigger.boot_id}")
    draft.move(S.VALIDATION_REQUIRED, "rebooted")


def _reboot_deadline(draft: Draft, expired: DeadlineExpired) -> None:
    draft.fail("reboot not confirmed: no new boot id in time", expired=True)


def _reboot_effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    if saga.boot_id_at_reboot is None:
        raise ValueError("a reboot needs the boot id it was decided in")
    reboot = dm.RebootNode(boot_id=saga.boot_id_at_reboot, reason=f"GPU remediation {saga.saga_id}")
    return (issue(saga, reboot),), ()


# validation-required: the ladder's rungs (upgradePolicy.validation) for the node's driver


def plan(spec: GPUClusterPolicySpec, operands_paused: bool) -> tuple[str, ...]:
    """The rungs' step tokens, in order (peermem is the OFED window's, not run here)."""
    tokens: list[str] = []
    for rung in spec.upgrade_policy.validation.ladder():
        if rung == "nvml":
            tokens.append("validate-gpu")
        elif rung == "cuda":
            tokens.append("validate-cuda-gpu")
        elif rung == "pod":
            if operands_paused:
                tokens.append("validate-resume")
            tokens.append("validate-pod")
    return tuple(tokens)


def _enter_validation(draft: Draft, retry: bool) -> None:
    if draft.saga.driver_version is None:
        draft.fail("no GPU driver version known to validate")
        return
    draft.update(paused=())
    draft.start(Step(name=plan(draft.spec, draft.saga.operands_paused)[0]))


def _next_rung(draft: Draft) -> None:
    saga = draft.saga
    tokens = plan(draft.spec, True)
    index = tokens.index(saga.step.name) if saga.step.name in tokens else len(tokens)
    following = [t for t in tokens[index + 1 :] if t != "validate-resume" or saga.operands_paused]
    if following:
        draft.start(Step(name=following[0]))
    else:
        draft.move(S.RELEASE_REQUIRED, "the GPUs validated")


def _on_validation(draft: Draft, trigger: Trigger) -> None:
    saga = draft.saga
    name = saga.step.name
    if name == "validate-resume":
        if (
            isinstance(trigger, dev.OperandResumed)
            and trigger.command_id == draft.step_id()
            and trigger.service in saga.operands
            and trigger.service not in saga.paused
        ):
            resumed = tuple(s for s in saga.operands if s in {*saga.paused, trigger.service})
            draft.update(paused=resumed)
            if len(resumed) == len(saga.operands):
                draft.update(paused=(), operands_paused=False)
                draft.outcome_ok("every operand resumed")
                _next_rung(draft)
        return
    if name == "validate-pod":
        if not _answers_action(draft, trigger):
            return
        if isinstance(trigger, kube.ValidationPodFailed):
            draft.fail(f"validate-pod: pod {trigger.pod} {trigger.reason}: {trigger.message}")
        elif isinstance(trigger, kube.ValidationPodSucceeded):
            draft.outcome_ok(f"pod {trigger.pod} Succeeded")
            _next_rung(draft)
        return
    if not isinstance(trigger, dm.DriverValidated | dm.DriverValidationFailed):
        return
    if trigger.command_id != draft.step_id():
        return
    if isinstance(trigger, dm.DriverValidationFailed):
        draft.fail(f"{name} ({trigger.reason}): {trigger.message}".rstrip(": "))
        return
    draft.outcome_ok(f"{trigger.devices} GPUs validated")
    _next_rung(draft)


def _validation_effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    name = saga.step.name
    if name == "validate-resume":
        return (issue(saga, dev.ResumeOperands(reason=f"validation of {saga.saga_id}")),), ()
    if name == "validate-pod":
        pod = spec.upgrade_policy.validation.pod
        run = upgrade_actions.RunValidationPod(
            id=action_id(saga), image=pod.image, command=pod.command, namespace=pod.namespace,
            runtime_class_name=pod.runtime_class_name, timeout_seconds=_timeout(saga, spec),
        )  # fmt: skip
        return (), (run,)
    if saga.driver_version is None:
        raise ValueError("no GPU driver version to validate")
    check = dm.ValidationCheck.CUDA if name == "validate-cuda-gpu" else dm.ValidationCheck.NVML
    validate = dm.ValidateDriver(
        component=dm.Component.GPU, version=saga.driver_version,
        expected_devices=saga.expected_devices, timeout_seconds=_timeout(saga, spec), check=check,
    )  # fmt: skip
    return (issue(saga, validate),), ()


# release-required: operands resumed; then done releases the node


def _enter_release(draft: Draft, retry: bool) -> None:
    if not draft.saga.operands_paused:
        draft.update(step=Step(name="release"), step_started=draft.now, deadline=None)
        draft.outcome(Result.SKIPPED, "operands running")
        _finish(draft, "the GPUs validated, operands running")
        return
    draft.update(paused=())
    draft.start(Step(name="release"))


def _finish(draft: Draft, reason: str) -> None:
    """Done, unless GPUs failed after this attempt asked for its GPUs' holders (too late
    for its reset): the next attempt remediates those, from its admission."""
    saga = draft.saga
    late = {gpu: xids for gpu, xids in saga.unhealthy.items() if gpu not in saga.gpu_uuids}
    if not late:
        draft.move(S.DONE, reason)
        return
    draft.update(
        unhealthy=late, gpu_uuids=tuple(sorted(late)), holders=(), holders_unknown=False,
        rebooted=False, boot_id_at_reboot=None,
    )  # fmt: skip
    draft.move(S.ADMISSION_REQUIRED, f"{reason}; {', '.join(sorted(late))} failed meanwhile")


def _on_release(draft: Draft, trigger: Trigger) -> None:
    saga = draft.saga
    if not isinstance(trigger, dev.OperandResumed) or trigger.command_id != draft.step_id():
        return
    if trigger.service not in saga.operands or trigger.service in saga.paused:
        return
    resumed = tuple(s for s in saga.operands if s in {*saga.paused, trigger.service})
    draft.update(paused=resumed)
    if len(resumed) == len(saga.operands):
        draft.update(paused=(), operands_paused=False)
        draft.outcome_ok("every operand resumed")
        _finish(draft, "operands resumed")


def _release_effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    return (issue(saga, dev.ResumeOperands(reason=f"GPU remediation {saga.saga_id} done")),), ()


# folded-into-upgrade: the node's upgrade reloads and validates the driver


def _enter_folded(draft: Draft, retry: bool) -> None:
    draft.start(Step(name="folded"))


def _on_folded(draft: Draft, trigger: Trigger) -> None:
    if not isinstance(trigger, NodeUpgradeStateChanged):
        return
    if trigger.to_state in (UpgradeState.UNCORDON_REQUIRED, UpgradeState.UPGRADE_DONE):
        draft.outcome_ok(f"the upgrade moved to {trigger.to_state}")
        draft.move(S.DONE, "the upgrade's reload and validation served")
    elif trigger.to_state is UpgradeState.UPGRADE_FAILED:
        draft.fail(f"the upgrade it folded into failed: {trigger.reason}")


# the ends


def _enter_end(draft: Draft, retry: bool) -> None:
    draft.start(Step(name="done" if draft.saga.state is S.DONE else "failed"))


def _done_effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    return (), (MirrorHealth(id=action_id(saga, "release"), unhealthy=(), taint=False),)


def _failed_effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    mirror = MirrorHealth(
        id=action_id(saga, "failed"),
        unhealthy=unhealthy_of(saga),
        taint=True if spec.remediation.quarantine else None,
        detail=f"remediation failed: {saga.failure}",
    )
    commands: tuple[IssuedCommand, ...] = ()
    if saga.operands_paused:
        # the node's other GPUs go back to work; the device plugin keeps the bad one Unhealthy
        resume = dev.ResumeOperands(reason=f"GPU remediation {saga.saga_id} failed")
        commands = (issue(saga, resume, "failed-resume"),)
    return commands, (mirror,)


def _phase(
    enter: Any, on_event: Any = ignore, on_deadline: Any = _expired, effects: Any = None
) -> Phase[RemediationSaga, Draft]:
    if effects is None:
        return Phase(enter=enter, on_event=on_event, on_deadline=on_deadline)
    return Phase(enter=enter, on_event=on_event, on_deadline=on_deadline, effects=effects)


PHASES: Mapping[S, Phase[RemediationSaga, Draft]] = MappingProxyType(
    {
        S.ADMISSION_REQUIRED: _phase(_enter_admission, _on_admission, ignore, _quarantine),
        S.HOLDERS_REQUIRED: _phase(_enter_holders, _on_holders, effects=_holders_effects),
        S.EVICTION_REQUIRED: _phase(_enter_eviction, _on_eviction, effects=_eviction_effects),
        S.OPERANDS_PAUSE_REQUIRED: _phase(_enter_pause, _on_pause, effects=_pause_effects),
        S.RESET_REQUIRED: _phase(_enter_reset, _on_reset, _reset_deadline, _reset_effects),
        S.REBOOT_REQUIRED: _phase(_enter_reboot, _on_reboot, _reboot_deadline, _reboot_effects),
        S.VALIDATION_REQUIRED: _phase(
            _enter_validation, _on_validation, effects=_validation_effects
        ),
        S.RELEASE_REQUIRED: _phase(_enter_release, _on_release, effects=_release_effects),
        S.FOLDED: _phase(_enter_folded, _on_folded, ignore, _quarantine),
        S.DONE: _phase(_enter_end, ignore, ignore, _done_effects),
        S.FAILED: _phase(_enter_end, ignore, ignore, _failed_effects),
    }
)
"""State -> its phase."""
