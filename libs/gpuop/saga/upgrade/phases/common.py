"""What several upgrade phases do alike: a deadline that fails the step, a driver's answer.

The driver states (driver-reload, rollback, validation, and cordon-required's stage steps)
each run a plan of driver steps, one command at a time: `on_driver_result` matches the
answer to the pending step (its command id), records its outcome and hands over to the
phase's `next_step`; a failure goes to the phase's `failed` (compensation, unless the phase
knows better).
"""

from __future__ import annotations

from collections.abc import Callable

from gpuop.events import driver as dm
from gpuop.events import kube
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.upgrade import UpgradeState
from gpuop.saga.machine import StepResult, Trigger, overdue
from gpuop.saga.upgrade import compensation
from gpuop.saga.upgrade.drafting import Draft
from gpuop.saga.upgrade.steps import Step, StepKind

SUCCESS: dict[StepKind, type[dm.DriverResult]] = {
    StepKind.STAGE: dm.DriverStaged,
    StepKind.INSTALL: dm.DriverInstalled,
    StepKind.UNLOAD: dm.DriverUnloaded,
    StepKind.LOAD: dm.DriverLoaded,
    StepKind.VALIDATE: dm.DriverValidated,
    StepKind.VALIDATE_CUDA: dm.DriverValidated,
    StepKind.VALIDATE_PEERMEM: dm.DriverValidated,
    StepKind.ROLLBACK: dm.DriverRolledBack,
    StepKind.ROLLBACK_VALIDATE: dm.DriverValidated,
    StepKind.RUNTIME_CONFIGURE: dm.RuntimeConfigured,
}
"""The answer that ends each driver step well."""
FAILURE: dict[StepKind, type[dm.DriverFailure]] = {
    StepKind.STAGE: dm.DriverStageFailed,
    StepKind.INSTALL: dm.DriverInstallFailed,
    StepKind.UNLOAD: dm.DriverUnloadFailed,
    StepKind.LOAD: dm.DriverLoadFailed,
    StepKind.VALIDATE: dm.DriverValidationFailed,
    StepKind.VALIDATE_CUDA: dm.DriverValidationFailed,
    StepKind.VALIDATE_PEERMEM: dm.DriverValidationFailed,
    StepKind.ROLLBACK: dm.DriverRollbackFailed,
    StepKind.ROLLBACK_VALIDATE: dm.DriverValidationFailed,
    StepKind.RUNTIME_CONFIGURE: dm.RuntimeConfigureFailed,
}
"""The answer that fails it."""


BROUGHT_UP = "a new node brought up behind the driver-not-ready taint: no GPU pods to move"
"""Why a bring-up saga (`NodeSaga.bring_up`) passes the cordon and the pod removals."""


def start_or_pass(
    draft: Draft, kind: StepKind, needed: bool, next_state: UpgradeState, reason: str
) -> None:
    """Start the state's one step of `kind`; when it is not `needed`, pass through to
    `next_state` instead, the step recorded as skipped for `reason`."""
    step = Step(kind=kind)
    if needed:
        draft.start(step)
    else:
        draft.skip(step, next_state, StepResult.SKIPPED, reason)


def answers_step(draft: Draft, trigger: Trigger) -> bool:
    """Whether `trigger` is the outcome of the Kubernetes action the pending step ordered."""
    return isinstance(trigger, kube.KubeActionResult) and trigger.action_id == draft.step_id()


def fail_on_deadline(draft: Draft, expired: DeadlineExpired) -> None:
    """Most steps' deadline: the step failed; compensate."""
    compensation.fail(draft, overdue(draft), StepResult.EXPIRED)


def fail_driver_step(draft: Draft, failure: dm.DriverFailure, detail: str) -> None:
    """A driver step's executor reported `failure`: compensate."""
    compensation.fail(draft, detail, StepResult.FAILED)


def on_driver_result(
    draft: Draft,
    trigger: Trigger,
    next_step: Callable[[Draft], None],
    failed: Callable[[Draft, dm.DriverFailure, str], None] = fail_driver_step,
) -> None:
    """A driver-manager's answer to the pending driver step, or nothing for anything else."""
    saga = draft.saga
    step = saga.step
    if not isinstance(trigger, dm.DriverResult) or step.kind not in SUCCESS:
        return
    if trigger.command_id != draft.step_id():
        return  # an answer to an earlier step or attempt
    if isinstance(trigger, FAILURE[step.kind]):
        detail = f"{type(trigger).__name__} {trigger.component}: {trigger.message}"
        failed(draft, trigger, detail.rstrip(": "))
        return
    if not isinstance(trigger, SUCCESS[step.kind]):
        return
    draft.outcome(StepResult.SUCCEEDED, f"{type(trigger).__name__} {trigger.component}")
    if step.kind is StepKind.UNLOAD:
        draft.touch(trigger.component)
    if step.kind is StepKind.ROLLBACK:
        draft.update(rolled_back=(*saga.rolled_back, trigger.component))
    next_step(draft)
