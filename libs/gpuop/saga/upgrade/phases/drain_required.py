"""drain-required: the node is drained as `kubectl drain` does, or passed through when
drain is disabled."""

from __future__ import annotations

from gpuop.events import kube
from gpuop.events.upgrade import UpgradeState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.actions import Drain
from gpuop.saga.machine import Effects, StepResult, Trigger
from gpuop.saga.upgrade import compensation
from gpuop.saga.upgrade.drafting import Draft
from gpuop.saga.upgrade.effects import action_id, timeout
from gpuop.saga.upgrade.phases.common import (
    BROUGHT_UP,
    answers_step,
    fail_on_deadline,
    start_or_pass,
)
from gpuop.saga.upgrade.records import NodeSaga
from gpuop.saga.upgrade.steps import StepKind

STATE = S.DRAIN_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    if draft.saga.bring_up:
        start_or_pass(draft, StepKind.DRAIN, False, S.OPERANDS_PAUSE_REQUIRED, BROUGHT_UP)
        return
    enabled = draft.policy.drain.enable
    start_or_pass(draft, StepKind.DRAIN, enabled, S.OPERANDS_PAUSE_REQUIRED, "drain disabled")


def on_event(draft: Draft, trigger: Trigger) -> None:
    if not answers_step(draft, trigger):
        return
    if isinstance(trigger, kube.DrainCompleted):
        draft.outcome(StepResult.SUCCEEDED, f"{trigger.evicted} pods evicted")
        draft.move(S.OPERANDS_PAUSE_REQUIRED, "node drained")
        return
    if not isinstance(trigger, kube.DrainFailed):
        return
    blocking = f", blocked by {trigger.blocking_pdb}" if trigger.blocking_pdb else ""
    detail = f"drain failed ({trigger.reason}{blocking}): {trigger.message}".rstrip(": ")
    compensation.fail(draft, detail, StepResult.FAILED)


on_deadline = fail_on_deadline


def effects(saga: NodeSaga, spec: GPUClusterPolicySpec) -> Effects:
    drain = spec.upgrade_policy.drain
    action = Drain(
        id=action_id(saga, saga.step.token),
        force=drain.force,
        pod_selector=drain.pod_selector,
        timeout_seconds=timeout(saga, spec.upgrade_policy),
        delete_empty_dir=drain.delete_empty_dir,
    )
    return (), (action,)
