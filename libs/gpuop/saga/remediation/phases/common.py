"""What several remediation phases share: ids, step deadlines, a deadline that fails the
step, the operands' confirmations, the node's marks (`quarantine`)."""

from __future__ import annotations

from collections.abc import Callable

from gpuop.events import device as dev
from gpuop.events import kube
from gpuop.events.deadlines import DeadlineExpired
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import actions as upgrade_actions
from gpuop.saga import machine, operands
from gpuop.saga.machine import Effects, Trigger
from gpuop.saga.remediation.actions import EVENT_REASON, MirrorHealth
from gpuop.saga.remediation.drafting import Draft
from gpuop.saga.remediation.records import RemediationSaga, Step
from gpuop.saga.upgrade.steps import executor_timeout

issue = machine.issue
action_id = machine.action_id


def unhealthy_of(saga: RemediationSaga) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(sorted(saga.unhealthy.items()))


def limit_seconds(saga: RemediationSaga, step: Step, spec: GPUClusterPolicySpec) -> float | None:
    """How long a step may take (`remediation.deadlines`); None for the waits without one
    (the admission, a folded remediation, the ends)."""
    deadlines = spec.remediation.deadlines
    limits = {
        "holders": deadlines.holders,
        "evict": deadlines.eviction,
        "operands-pause": deadlines.operands_pause,
        "release": deadlines.operands_pause,
        "untaint": deadlines.operands_pause,
        "validate-resume": deadlines.operands_pause,
        "reset": deadlines.reset,
        "reboot": deadlines.reboot,
    }
    preflight = spec.upgrade_policy.validation.preflight
    if step.name == "validate-preflight" and preflight is not None:
        return float(preflight.deadline_seconds)
    if step.name in limits:
        return float(limits[step.name])
    if step.name.startswith("validate-"):
        return float(deadlines.validation)
    return None


def timeout(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> int:
    """The executor's timeout for the pending step: 90% of its deadline."""
    limit = limit_seconds(saga, saga.step, spec)
    if limit is None:
        raise ValueError(f"step {saga.step.token} has no deadline to take a timeout from")
    return executor_timeout(limit)


def fail_on_deadline(draft: Draft, expired: DeadlineExpired) -> None:
    """Most steps' deadline: the remediation failed."""
    draft.fail(f"{draft.saga.step.token} did not finish in time", expired=True)


def answers_action(draft: Draft, trigger: Trigger) -> bool:
    """Whether `trigger` is the outcome of the Kubernetes action the pending step ordered."""
    return isinstance(trigger, kube.KubeActionResult) and trigger.action_id == draft.step_id()


def on_operands(
    draft: Draft, trigger: Trigger, kind: type[dev.OperandPaused | dev.OperandResumed],
    every: Callable[[Draft], None],
) -> None:  # fmt: skip
    """Count an operand's confirmation of the pending pause or resume (`kind`); `every`
    once each operand confirmed."""
    if operands.count(draft, trigger, kind):
        draft.update(paused=())
        every(draft)


def quarantined_devices(saga: RemediationSaga) -> tuple[str, ...] | None:
    """The devices a DRA node's quarantine taints (`MirrorHealth.devices`); None: the node."""
    return saga.quarantined_devices if saga.device_quarantine else None


def quarantine(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    """The node marked: `GPUHealthy` False naming the GPUs and XIDs, the taint when the
    policy quarantines (on a DRA node, the faulty GPUs' devices' instead of the node's), a
    Kubernetes Event."""
    mirror = MirrorHealth(
        id=action_id(saga, "quarantine"),
        unhealthy=unhealthy_of(saga),
        taint=True if spec.remediation.quarantine else None,
        devices=quarantined_devices(saga),
    )
    gpus = ", ".join(saga.gpu_uuids)
    event = upgrade_actions.RecordEvent(
        id=action_id(saga, "quarantine-event"),
        reason=EVENT_REASON,
        message=f"GPU remediation {saga.saga_id} of {gpus} ({saga.action})"[:1024],
        warning=True,
    )
    return (), (mirror, event)
