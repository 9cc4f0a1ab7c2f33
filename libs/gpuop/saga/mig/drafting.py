"""The MIG reconfiguration's draft: the machinery's `Draft` with what its phases share.

Used inside one decision by the phases (`gpuop.saga.mig.phases`): ids for what a step
issues, the failure path (`fail`), and `announce`, which makes each move visible: the node
label `nvidia.com/mig.config.state` when its value changes (pending while anything runs,
success, failed), and a Kubernetes Event for the moves an administrator looks for (the
reconfiguration started, a restore, the end).

Compensation, in one place (`fail`): what a failure leads to depends on what was done.

    the apply was sent, the layout not known back   restore-required (when the layout at
                                                    the start is known), else resume
    operands paused                                  operands-resume-required, then failed
    nothing done                                     mig-config-failed
"""

from __future__ import annotations

from enum import StrEnum

from gpuop.events import ids
from gpuop.policy.mig import MigPolicy
from gpuop.saga import machine
from gpuop.saga.machine import StepResult, Transition
from gpuop.saga.mig.actions import EVENT_REASON, MigKubeAction, RecordEvent, SetConfigState
from gpuop.saga.mig.records import MigFailure, MigSaga
from gpuop.saga.mig.states import MigState, config_state

S = MigState
_WARNING_STATES = frozenset({S.MIG_CONFIG_FAILED, S.RESTORE_REQUIRED})
RECORDED_STATES = frozenset({S.OPERANDS_PAUSE_REQUIRED, S.MIG_CONFIG_DONE, *_WARNING_STATES})
"""The states whose entry is recorded as a Kubernetes Event on the node."""


class Draft(machine.Draft[MigSaga, MigState]):
    """A MIG saga being decided on; `decision()` is the result."""

    @property
    def policy(self) -> MigPolicy:
        return self.spec.mig

    def fail(self, reason: str, result: StrEnum = StepResult.FAILED) -> None:
        """The pending step failed for `reason`: record it and compensate."""
        saga = self.saga
        self.outcome(result, reason)
        if saga.failure is None:
            failure = MigFailure(
                state=saga.state, step=saga.step.kind, reason=reason[:2048], at=self.now
            )
            self.update(failure=failure)
        self.compensate(reason)

    def compensate(self, reason: str) -> None:
        """Undo what was done, the most changed first (see the module docstring)."""
        saga = self.saga
        if saga.applied and saga.restored is None:
            if saga.plan.restorable and S.RESTORE_REQUIRED in self.kind.table[saga.state]:
                self.move(S.RESTORE_REQUIRED, f"{reason}; restoring the layout at the start")
                return
            self.update(restored=False)
        if saga.operands_paused:
            self.move(S.OPERANDS_RESUME_REQUIRED, f"{reason}; resuming the operands")
        else:
            self.move(S.MIG_CONFIG_FAILED, reason)


issue = machine.issue
action_id = machine.action_id


def label_action(saga: MigSaga) -> SetConfigState:
    """The write of the state label for the saga's latest transition (or its start)."""
    return SetConfigState(
        id=ids.label(saga.saga_id, saga.sequence, saga.attempt), value=config_state(saga.state)
    )


def announce(saga: MigSaga, transition: Transition[MigState]) -> tuple[MigKubeAction, ...]:
    """The label when its value changes, and an Event for `RECORDED_STATES`."""
    actions: list[MigKubeAction] = []
    if config_state(transition.from_state) is not config_state(transition.to_state):
        actions.append(label_action(saga))
    if transition.to_state in RECORDED_STATES:
        message = (
            f"{saga.config}: {transition.from_state} -> {transition.to_state}: {transition.reason}"
        )
        actions.append(
            RecordEvent(
                id=ids.kube_event(saga.saga_id, saga.sequence, saga.attempt),
                reason=EVENT_REASON,
                message=message[:1024],
                warning=transition.to_state in _WARNING_STATES,
            )
        )
    return tuple(actions)
