"""wait-for-jobs-required: selected jobs may finish; the deadline moves on, never fails."""

from __future__ import annotations

from gpuop.events import kube
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.upgrade import UpgradeState as S
from gpuop.saga.machine import StepResult, Trigger, no_effects, overdue
from gpuop.saga.upgrade.drafting import Draft
from gpuop.saga.upgrade.phases.common import BROUGHT_UP, start_or_pass
from gpuop.saga.upgrade.steps import StepKind

STATE = S.WAIT_FOR_JOBS_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    selector = bool(draft.policy.wait_for_completion.pod_selector)
    next_state = S.POD_DELETION_REQUIRED
    if draft.saga.bring_up:
        start_or_pass(draft, StepKind.WAIT_FOR_JOBS, False, next_state, BROUGHT_UP)
        return
    start_or_pass(draft, StepKind.WAIT_FOR_JOBS, selector, next_state, "no jobs to wait for")


def on_event(draft: Draft, trigger: Trigger) -> None:
    if isinstance(trigger, kube.PodsObserved) and trigger.job_pods == 0:
        draft.outcome(StepResult.SUCCEEDED, "no selected job left")
        draft.move(S.POD_DELETION_REQUIRED, "no selected job runs on the node")


def on_deadline(draft: Draft, expired: DeadlineExpired) -> None:
    detail = overdue(draft)
    draft.outcome(StepResult.EXPIRED, detail)
    draft.move(S.POD_DELETION_REQUIRED, f"{detail}; going on with pod deletion")


effects = no_effects
"""Only a wait: nothing to issue."""
