"""The MIG reconfiguration's fold, shared by the orchestrator's runtime and `gpuop replay`.

    inbound    the events a reconfiguration decides: a relabel (queued), operand
               confirmations, the holders' listing, the apply's answers, Kubernetes outcomes
               and observations, expired deadlines, admissions
    started    a saga built from its `MigReconfigurationStarted`, and that event for a saga
    step       one decision, or None when the saga is left as it was
    outputs    a decision's public state changes, then its commands, with their ids
    holds      whether a saga holds its node (unavailable to every other kind); `waiting`
               whether it waits for an admission

Pure, like the kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gpuop.events import Event, ids, kube
from gpuop.events import device as dev
from gpuop.events import mig_commands as migev
from gpuop.events import remediation_commands as rem
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.mig import MigReconfigurationStarted, NodeMigStateChanged
from gpuop.events.mig_requests import MigConfigRequested
from gpuop.events.upgrade import NodeAdmitted
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import machine
from gpuop.saga.machine import Admitted, IssuedCommand, Trigger
from gpuop.saga.mig import kind, records
from gpuop.saga.mig.records import MigSaga
from gpuop.saga.mig.states import TERMINAL_STATES, MigState, config_state

INBOUND: tuple[type[Event], ...] = (
    MigConfigRequested,
    dev.OperandPaused,
    dev.OperandResumed,
    rem.GpuHoldersListed,
    rem.GpuHoldersUnknown,
    migev.MigLayoutApplied,
    migev.MigLayoutFailed,
    DeadlineExpired,
    NodeAdmitted,
)


def is_inbound(event: Event) -> bool:
    """Whether the reconfiguration's fold consumes `event`."""
    return isinstance(event, INBOUND) or event.DOMAIN == kube.DOMAIN


def trigger(saga: MigSaga, event: Event) -> Trigger | None:
    """What `event` means to `saga`: `Admitted` for its own admission, else the event."""
    if not isinstance(event, NodeAdmitted):
        return event
    if (event.saga_id, event.attempt) != (saga.saga_id, saga.attempt):
        return None
    return Admitted()


def started(node: str, event: MigReconfigurationStarted, now: datetime) -> MigSaga:
    """The saga `event` started (before its first decision, `kind.begin`)."""
    saga = records.new_saga(
        node=node, request_id=event.request_id, plan=event.plan, now=now, operands=event.operands
    )
    return saga.model_copy(update={"saga_id": event.saga_id})


def start_of(saga: MigSaga) -> MigReconfigurationStarted:
    """The `MigReconfigurationStarted` that `started` rebuilds `saga` from."""
    return MigReconfigurationStarted(
        saga_id=saga.saga_id, request_id=saga.request_id, plan=saga.plan, operands=saga.operands
    )


def step(
    saga: MigSaga, event: Event, spec: GPUClusterPolicySpec, now: datetime
) -> kind.Decision | None:
    """Decide `event` for `saga` at `now`: the decision, or None when nothing changed."""
    if not is_inbound(event):
        return None
    meaning = trigger(saga, event)
    if meaning is None:
        return None
    decision = kind.decide(saga, meaning, spec, now)
    return None if decision.saga == saga else decision


@dataclass(frozen=True)
class StateChange:
    """A public state change with the id that makes a republished one a duplicate."""

    id: str
    payload: NodeMigStateChanged


def state_changed(saga: MigSaga, transition: machine.Transition[MigState]) -> NodeMigStateChanged:
    return NodeMigStateChanged(
        saga_id=saga.saga_id,
        config=saga.config,
        from_state=transition.from_state,
        to_state=transition.to_state,
        config_state=config_state(transition.to_state),
        reason=transition.reason[:2048],
        attempt=transition.attempt,
    )


def outputs(decision: kind.Decision) -> list[StateChange | IssuedCommand]:
    """The decision's state changes, then its commands (the outbox's order)."""
    saga = decision.saga
    first = saga.sequence - len(decision.transitions) + 1
    changes: list[StateChange | IssuedCommand] = [
        StateChange(ids.transition(saga.saga_id, first + n), state_changed(saga, transition))
        for n, transition in enumerate(decision.transitions)
    ]
    return changes + list(decision.commands)


def holds(saga: MigSaga) -> bool:
    """The reconfiguration holds its node: admitted and not ended."""
    return saga.state not in (*TERMINAL_STATES, MigState.MIG_CONFIG_REQUIRED)


def waiting(saga: MigSaga) -> bool:
    """The reconfiguration waits for its admission."""
    return saga.state is MigState.MIG_CONFIG_REQUIRED
