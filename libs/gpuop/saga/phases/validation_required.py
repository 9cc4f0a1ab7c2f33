"""validation-required: validate each component's new driver, or, after a rollback, each
restored one; only then is the node uncordoned."""

from __future__ import annotations

from gpuop.events.driver import Component
from gpuop.events.upgrade import UpgradeState as S
from gpuop.saga import compensation
from gpuop.saga.drafting import Draft
from gpuop.saga.effects import driver_effects
from gpuop.saga.machine import Trigger
from gpuop.saga.phases.common import fail_on_deadline, on_driver_result
from gpuop.saga.steps import Step, after, validation_plan

STATE = S.VALIDATION_REQUIRED


def _plan(draft: Draft) -> tuple[tuple[Step, ...], bool]:
    saga = draft.saga
    rollback = saga.failure is not None
    components: tuple[Component, ...] = saga.rolled_back if rollback else saga.components
    return validation_plan(components, rollback), rollback


def enter(draft: Draft, retry: bool) -> None:
    draft.start(_plan(draft)[0][0])


def _next_step(draft: Draft) -> None:
    saga = draft.saga
    plan, rollback = _plan(draft)
    following = after(plan, saga.step)
    if following is not None:
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


def on_event(draft: Draft, trigger: Trigger) -> None:
    on_driver_result(draft, trigger, _next_step)


on_deadline = fail_on_deadline


effects = driver_effects
