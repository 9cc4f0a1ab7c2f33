"""The decision being drafted: one saga, the moves made and the effects they issue.

Used only inside one call of `gpuop.saga.core.decide` (and by `gpuop.saga.compensation`):
`Draft` holds the saga as it changes, and every move goes through `Draft.move`, which checks
it against the transition table (`gpuop.saga.transitions.require`), counts it, writes the
state label, and enters the new state's first step with its deadline and effects. States
with nothing to wait for are passed through in the same decision (no wait-for-jobs
selector, drain disabled, nothing to uncordon), so they still appear as moves.

A Kubernetes Event is recorded only for the moves an administrator acts on or looks for in
`kubectl describe node` (`RECORDED_STATES`: the upgrade started, a reboot, a rollback, a
failure, done), not for every move as upstream's library does: each Event is a request to
the API server, and the complete trail of every move, with its reason, is the log of public
`NodeUpgradeStateChanged` events on the bus.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from gpuop.events import ids
from gpuop.events.driver import Component
from gpuop.events.upgrade import UpgradeState
from gpuop.policy import GPUClusterPolicySpec, UpgradePolicy
from gpuop.saga.actions import (
    EVENT_REASON,
    Decision,
    IssuedCommand,
    KubeAction,
    RecordEvent,
    SetStateLabel,
)
from gpuop.saga.effects import event_id, label_id, step_effects
from gpuop.saga.records import NodeSaga, Outcome, StepResult, ordered
from gpuop.saga.steps import (
    Step,
    StepKind,
    limit_seconds,
    reload_plan,
    rollback_plan,
    validation_plan,
)
from gpuop.saga.transitions import Transition, require

S = UpgradeState
_WARNING_STATES = frozenset({S.UPGRADE_FAILED, S.ROLLBACK_REQUIRED, S.REBOOT_REQUIRED})
RECORDED_STATES = frozenset({S.CORDON_REQUIRED, S.UPGRADE_DONE, *_WARNING_STATES})
"""The states whose entry is recorded as a Kubernetes Event on the node: the upgrade started
(admitted, cordoning), it ended (done or failed), or the node is rebooted or rolled back."""


class Draft:
    """A saga being decided on; `decision()` is the result."""

    def __init__(self, saga: NodeSaga, spec: GPUClusterPolicySpec, now: datetime) -> None:
        self.saga = saga
        self.spec = spec
        self.policy: UpgradePolicy = spec.upgrade_policy
        self.now = now
        self.commands: list[IssuedCommand] = []
        self.actions: list[KubeAction] = []
        self.transitions: list[Transition] = []

    def decision(self) -> Decision:
        if self.transitions:
            self.update(last_transitions=tuple(self.transitions))
        return Decision(
            saga=self.saga,
            commands=tuple(self.commands),
            kube_actions=tuple(self.actions),
            transitions=tuple(self.transitions),
        )

    def update(self, **changes: Any) -> None:
        self.saga = self.saga.model_copy(update=changes)

    def step_id(self) -> str:
        """The id the pending step's command or action was issued under."""
        return ids.step(self.saga.saga_id, self.saga.step.token, self.saga.attempt)

    def outcome(self, result: StepResult, detail: str) -> None:
        """Record how the pending step ended."""
        saga = self.saga
        self.saga = saga.with_outcome(
            Outcome(
                at=self.now,
                attempt=saga.attempt,
                state=saga.state,
                step=saga.step.token,
                result=result,
                detail=detail[:2048],
            )
        )

    def touch(self, component: Component) -> None:
        """`component`'s running driver was changed and is not validated yet."""
        self.update(touched=ordered((*self.saga.touched, component)))

    def installable(self) -> frozenset[Component]:
        """Components with a source to install from (the others must be on the host)."""
        return frozenset(c for c, t in self.saga.targets.items() if t.source is not None)

    def rollback_components(self) -> tuple[Component, ...]:
        """Touched components with a previous version to go back to."""
        saga = self.saga
        return tuple(c for c in saga.touched if c in saga.previous_versions)

    def start(self, step: Step) -> None:
        """Make `step` the pending one: arm its deadline and issue its effects."""
        limit = limit_seconds(step, self.policy, self.saga.attempt)
        deadline = None if limit is None else self.now + timedelta(seconds=limit)
        self.update(step=step, step_started=self.now, deadline=deadline)
        commands, actions = step_effects(self.saga, self.spec)
        self.commands.extend(commands)
        self.actions.extend(actions)

    def move(self, to_state: UpgradeState, reason: str, *, retry: bool = True) -> None:
        """Move to `to_state` (the table must have it) and start its first step; `retry`
        False makes an upgrade-failed final (the node is gone)."""
        saga = self.saga
        require(saga.state, to_state)
        attempt = saga.attempt + 1 if to_state is S.UPGRADE_REQUIRED else saga.attempt
        self.update(state=to_state, sequence=saga.sequence + 1, attempt=attempt)
        self.transitions.append(Transition(saga.state, to_state, reason, attempt))
        self.actions.append(SetStateLabel(id=label_id(self.saga), value=to_state))
        if to_state in RECORDED_STATES:
            self.actions.append(
                RecordEvent(
                    id=event_id(self.saga),
                    reason=EVENT_REASON,
                    message=f"{saga.state} -> {to_state} (attempt {attempt}): {reason}"[:1024],
                    warning=to_state in _WARNING_STATES,
                )
            )
        self._enter(to_state, retry)

    def _enter(self, state: UpgradeState, retry: bool) -> None:
        saga, policy = self.saga, self.policy
        if state is S.UPGRADE_REQUIRED:
            self.start(Step(kind=StepKind.ADMISSION))
        elif state is S.CORDON_REQUIRED:
            self.update(cordoned=True)
            self.start(Step(kind=StepKind.CORDON))
        elif state is S.WAIT_FOR_JOBS_REQUIRED:
            if policy.wait_for_completion.pod_selector:
                self.start(Step(kind=StepKind.WAIT_FOR_JOBS))
            else:
                self._skip(StepKind.WAIT_FOR_JOBS, S.POD_DELETION_REQUIRED, "no jobs to wait for")
        elif state is S.POD_DELETION_REQUIRED:
            self.start(Step(kind=StepKind.POD_DELETION))
        elif state is S.DRAIN_REQUIRED:
            if policy.drain.enable:
                self.start(Step(kind=StepKind.DRAIN))
            else:
                self._skip(StepKind.DRAIN, S.OPERANDS_PAUSE_REQUIRED, "drain disabled")
        elif state is S.OPERANDS_PAUSE_REQUIRED:
            if saga.operands:
                self.update(paused=(), operands_paused=True)
                self.start(Step(kind=StepKind.OPERANDS_PAUSE))
            else:
                self._skip(StepKind.OPERANDS_PAUSE, S.DRIVER_RELOAD_REQUIRED, "no operands")
        elif state is S.DRIVER_RELOAD_REQUIRED:
            self.start(reload_plan(saga.components, self.installable(), saga.reload_round)[0])
        elif state is S.REBOOT_REQUIRED:
            self.start(Step(kind=StepKind.REBOOT))
        elif state is S.ROLLBACK_REQUIRED:
            self.update(rolled_back=())
            self.start(rollback_plan(self.rollback_components())[0])
        elif state is S.VALIDATION_REQUIRED:
            rollback = saga.failure is not None
            components = saga.rolled_back if rollback else saga.components
            self.start(validation_plan(components, rollback)[0])
        elif state is S.UNCORDON_REQUIRED:
            self.start(Step(kind=StepKind.UNCORDON))
            if saga.initially_unschedulable:
                # only the resume was issued: there is no uncordon to wait for
                self.outcome(StepResult.SKIPPED, "node was cordoned before the upgrade")
                self.finish("left cordoned as it was found")
        elif state is S.UPGRADE_DONE:
            self.start(Step(kind=StepKind.DONE))
        else:
            self._enter_failed(retry)

    def _skip(self, kind: StepKind, to_state: UpgradeState, reason: str) -> None:
        """Pass through a state whose step has nothing to do."""
        self.update(step=Step(kind=kind), step_started=self.now, deadline=None)
        self.outcome(StepResult.SKIPPED, reason)
        self.move(to_state, reason)

    def finish(self, reason: str) -> None:
        """End uncordon-required: done, or failed when the attempt had failed."""
        self.update(operands_paused=False, cordoned=False, paused=())
        failure = self.saga.failure
        if failure is None:
            self.move(S.UPGRADE_DONE, reason)
        else:
            self.move(S.UPGRADE_FAILED, f"{failure.reason} (compensated: {reason})")

    def _enter_failed(self, retry: bool) -> None:
        saga = self.saga
        reason = saga.failure.reason if saga.failure else "failed"
        self.update(last_error=reason)
        if retry and saga.attempt < self.policy.retry.max_attempts:
            self.start(Step(kind=StepKind.BACKOFF))
            self.update(retry_at=self.saga.deadline)
        else:
            self.start(Step(kind=StepKind.FAILED))
            self.update(retry_at=None)
