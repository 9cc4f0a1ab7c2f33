"""upgrade-failed: the attempt failed (its first failure's reason kept); with attempts left
a backoff deadline is armed, whose expiry retries from upgrade-required."""

from __future__ import annotations

from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.upgrade import UpgradeState as S
from gpuop.saga.machine import StepResult, ignore, no_effects
from gpuop.saga.upgrade import compensation
from gpuop.saga.upgrade.drafting import Draft
from gpuop.saga.upgrade.steps import Step, StepKind

STATE = S.UPGRADE_FAILED


def enter(draft: Draft, retry: bool) -> None:
    saga = draft.saga
    reason = saga.failure.reason if saga.failure else "failed"
    draft.update(last_error=reason)
    if retry and saga.attempt < draft.policy.retry.max_attempts:
        draft.start(Step(kind=StepKind.BACKOFF))
        draft.update(retry_at=draft.saga.deadline)
    else:
        draft.start(Step(kind=StepKind.FAILED))
        draft.update(retry_at=None)


on_event = ignore


def on_deadline(draft: Draft, expired: DeadlineExpired) -> None:
    if draft.saga.step.kind is StepKind.BACKOFF:
        draft.outcome(StepResult.SUCCEEDED, "backoff passed")
        compensation.retry(draft)


effects = no_effects
"""Only a wait: nothing to issue."""
