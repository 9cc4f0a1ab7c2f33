"""driver-reload-required: install, unload and load each component, one step at a time
(`gpuop.saga.upgrade.steps.reload_plan`), then, when the policy asks, configure the container
runtime. An unload that fails in use reboots the node when the policy allows, once per
attempt; an unanswered unload leaves the driver touched. A runtime that does not come back
(the driver-manager put its earlier files back) fails the step into the rollback."""

from __future__ import annotations

from gpuop.events import driver as dm
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.driver import UnloadFailureReason
from gpuop.events.upgrade import UpgradeState as S
from gpuop.saga.machine import StepResult, Trigger, overdue
from gpuop.saga.upgrade import compensation
from gpuop.saga.upgrade.drafting import Draft
from gpuop.saga.upgrade.effects import driver_effects
from gpuop.saga.upgrade.phases.common import on_driver_result
from gpuop.saga.upgrade.steps import Step, StepKind, after, reload_plan

STATE = S.DRIVER_RELOAD_REQUIRED


def _plan(draft: Draft) -> tuple[Step, ...]:
    saga = draft.saga
    return reload_plan(
        saga.components,
        draft.installable(),
        saga.reload_round,
        configure_runtime=draft.policy.configure_runtime,
    )


def enter(draft: Draft, retry: bool) -> None:
    draft.start(_plan(draft)[0])


def _next_step(draft: Draft) -> None:
    following = after(_plan(draft), draft.saga.step)
    if following is None:
        draft.move(S.VALIDATION_REQUIRED, "new drivers loaded")
    else:
        draft.start(following)


def _failed(draft: Draft, failure: dm.DriverFailure, detail: str) -> None:
    saga = draft.saga
    if (
        isinstance(failure, dm.DriverUnloadFailed)
        and failure.reason is UnloadFailureReason.IN_USE
        and draft.policy.reboot_on_unload_failure
        and saga.reboots == 0
        and saga.boot_id is not None
    ):
        draft.outcome(StepResult.FAILED, detail)
        draft.update(
            boot_id_at_reboot=saga.boot_id, reboots=saga.reboots + 1, touched=saga.components
        )
        draft.move(S.REBOOT_REQUIRED, f"{detail}; rebooting to release the driver")
        return
    compensation.fail(draft, detail, StepResult.FAILED)


def on_event(draft: Draft, trigger: Trigger) -> None:
    on_driver_result(draft, trigger, _next_step, _failed)


def on_deadline(draft: Draft, expired: DeadlineExpired) -> None:
    step = draft.saga.step
    if step.kind is StepKind.UNLOAD and step.component is not None:
        draft.touch(step.component)  # unanswered: the modules' state is unknown
    compensation.fail(draft, overdue(draft), StepResult.EXPIRED)


effects = driver_effects
