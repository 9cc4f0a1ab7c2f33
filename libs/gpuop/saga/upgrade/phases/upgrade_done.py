"""upgrade-done: the node runs the validated target drivers and is schedulable. Final for
this rollout: a new rollout starts a new saga."""

from __future__ import annotations

from gpuop.events.upgrade import UpgradeState as S
from gpuop.saga.machine import ignore, no_effects
from gpuop.saga.upgrade.drafting import Draft
from gpuop.saga.upgrade.steps import Step, StepKind

STATE = S.UPGRADE_DONE


def enter(draft: Draft, retry: bool) -> None:
    draft.start(Step(kind=StepKind.DONE))


on_event = ignore
on_deadline = ignore


effects = no_effects
"""Only a wait: nothing to issue."""
