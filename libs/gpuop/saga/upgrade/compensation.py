"""What a failed step leads to: compensation, rollback, the end of an attempt, a retry.

Called by the decision core (`gpuop.saga.upgrade.core`) when a step's executor reports a
failure or its deadline passes. Where the failure happened decides what must be undone
(docs/saga-kinds.md):

    drivers untouched (no unload yet)   -> uncordon-required: resume the operands and uncordon
                                           (unless cordoned before), then upgrade-failed
    a driver touched, rollback allowed  -> rollback-required: restore the previous versions,
                                           validate them, only then uncordon; upgrade-failed
    a driver touched, no rollback       -> upgrade-failed at once, cordoned, operands paused
    already compensating                -> upgrade-failed, cordoned: an operator is needed
    (also when a touched component has no previous version to restore)
    in uncordon-required                -> upgrade-failed (the driver question is settled)

"Touched" outlives the attempt (`NodeSaga.touched`): a retry of a node whose driver was left
broken never uncordons it on an early failure. upgrade-failed always keeps the first failure's
reason; with attempts left it arms a backoff deadline, whose expiry retries the node from
upgrade-required with the next attempt.
"""

from __future__ import annotations

from gpuop.events.upgrade import UpgradeState
from gpuop.saga.machine import StepResult
from gpuop.saga.upgrade.drafting import Draft
from gpuop.saga.upgrade.records import Failure
from gpuop.saga.upgrade.steps import Step, StepKind

S = UpgradeState


def fail(draft: Draft, reason: str, result: StepResult) -> None:
    """The pending step failed for `reason`: record it and compensate."""
    draft.outcome(result, reason)
    saga = draft.saga
    if saga.failure is not None:
        _end(draft, f"{saga.failure.reason}; then {reason}")
    elif saga.state is S.UNCORDON_REQUIRED:
        _end(draft, reason)
    elif saga.touched:
        if draft.policy.rollback_on_failure and draft.rollback_components():
            _record(draft, reason)
            draft.move(S.ROLLBACK_REQUIRED, f"{reason}; rolling back")
        else:
            why = (
                "no previous version to roll back to"
                if draft.policy.rollback_on_failure
                else "rollback disabled"
            )
            _end(draft, f"{reason} ({why}; the node stays cordoned)")
    elif saga.operands_paused or (saga.cordoned and not saga.initially_unschedulable):
        _record(draft, reason)
        draft.move(S.UNCORDON_REQUIRED, f"{reason}; undoing the cordon")
    else:
        _end(draft, reason)


def give_up(draft: Draft, reason: str) -> None:
    """Compensation cannot finish safely: upgrade-failed, cordoned, with both reasons."""
    first = draft.saga.failure
    _end(draft, f"{first.reason}; then {reason}" if first else reason)


def _record(draft: Draft, reason: str) -> None:
    saga = draft.saga
    failure = Failure(state=saga.state, step=saga.step.token, reason=reason[:2048], at=draft.now)
    draft.update(failure=failure)


def _end(draft: Draft, reason: str, *, retry: bool = True) -> None:
    _record(draft, reason)
    draft.move(S.UPGRADE_FAILED, reason, retry=retry)


def retry(draft: Draft) -> None:
    """The backoff of an upgrade-failed saga passed: try again from upgrade-required."""
    draft.update(
        failure=None,
        retry_at=None,
        reboots=0,
        reload_round=1,
        rolled_back=(),
        paused=(),
        boot_id_at_reboot=None,
    )
    draft.move(S.UPGRADE_REQUIRED, f"retrying after: {draft.saga.last_error}")


def node_removed(draft: Draft) -> None:
    """The node object is gone: the saga ends without compensation or retry."""
    saga = draft.saga
    if saga.state is S.UPGRADE_DONE:
        return
    if saga.state is S.UPGRADE_FAILED:
        if saga.step.kind is StepKind.BACKOFF:
            draft.update(step=Step(kind=StepKind.FAILED), deadline=None, retry_at=None)
        return
    reason = "node removed from the cluster"
    draft.outcome(StepResult.SKIPPED, reason)
    _end(draft, reason, retry=False)
