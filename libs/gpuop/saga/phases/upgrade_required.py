"""upgrade-required: the node waits for a slot; an admission cordons it."""

from __future__ import annotations

from gpuop.events.upgrade import UpgradeState as S
from gpuop.saga.drafting import Draft
from gpuop.saga.machine import Admitted, Trigger, ignore, no_effects
from gpuop.saga.steps import Step, StepKind

STATE = S.UPGRADE_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    draft.start(Step(kind=StepKind.ADMISSION))


def on_event(draft: Draft, trigger: Trigger) -> None:
    if isinstance(trigger, Admitted):
        draft.update(canary=trigger.canary)
        reason = "admitted as a canary node" if trigger.canary else "admitted"
        draft.move(S.CORDON_REQUIRED, reason)


on_deadline = ignore
"""Admission has no deadline: a node waits for its slot as long as the rollout takes."""


effects = no_effects
"""Only a wait: nothing to issue."""
