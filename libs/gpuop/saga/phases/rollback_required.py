"""rollback-required: restore the previous version of every touched component, in unload
order; validation-required then validates what was restored."""

from __future__ import annotations

from gpuop.events.upgrade import UpgradeState as S
from gpuop.saga.drafting import Draft
from gpuop.saga.effects import driver_effects
from gpuop.saga.machine import Trigger
from gpuop.saga.phases.common import fail_on_deadline, on_driver_result
from gpuop.saga.steps import after, rollback_plan

STATE = S.ROLLBACK_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    draft.update(rolled_back=())
    draft.start(rollback_plan(draft.rollback_components())[0])


def _next_step(draft: Draft) -> None:
    following = after(rollback_plan(draft.rollback_components()), draft.saga.step)
    if following is None:
        draft.move(S.VALIDATION_REQUIRED, "previous drivers restored")
    else:
        draft.start(following)


def on_event(draft: Draft, trigger: Trigger) -> None:
    on_driver_result(draft, trigger, _next_step)


on_deadline = fail_on_deadline


effects = driver_effects
