"""The kind contract: what the orchestrator's runtime and `gpuop replay` need of a saga kind.

Every kind (the driver upgrade, GPU remediation, MIG reconfiguration: `registry.KINDS`)
hands the machinery one `SagaKind`, written in its folder's `folding` module, pure like the
rest of the kind:

    SagaKind    how its record is stored (a key prefix of its own in `gpuop_sagas`; the
                upgrade's is empty: its keys are bare node tokens), which events of the log
                it decides (`inbound`, and the subjects the intake consumes for them), its
                one fold step (the one replay takes too), the public state change of a move
                (`state_changed`; `outputs`: what a decision publishes, with its ids), what
                a stored saga issues again after a crash (`pending`), whether a saga holds
                its node (`holds`: unavailable to every other kind, one
                `maxUnavailable` budget), waits for an admission (`waiting`) or has ended
                (`ended`), the event that records a start (`started_by`) and the pure hook
                that builds the saga from it (`start`), and the circuit breaker its starts
                are put to, if any (`breaker`): the live starter and replay ask the same one
    StateChange a public state change a decision publishes, with its deterministic id
    Output      what a decision publishes: its state changes, then its commands

`outputs`, `admission_trigger` and `fold_step` are the pieces of a fold every kind writes
the same way, here once. Pure: no bus, no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
from typing import Any, Generic, TypeVar

from gpuop.events import Event, ids, subjects
from gpuop.events.upgrade import NodeAdmitted
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.machine import Admitted, Decision, IssuedCommand, SagaRecord, Transition, Trigger

R = TypeVar("R", bound=SagaRecord[Any])
"""A kind's record."""
P = TypeVar("P", bound=Event)


@dataclass(frozen=True)
class StateChange(Generic[P]):
    """A public state change a decision publishes, with the id that makes a republished one
    a duplicate (`ids.transition` of the saga and the move's sequence)."""

    id: str
    payload: P


Output = StateChange[Any] | IssuedCommand
"""What a decision publishes, in order: its state changes, then its commands."""


def outputs(
    decision: Decision[Any, Any], state_changed: Callable[[Any, Transition[Any]], P]
) -> list[StateChange[P] | IssuedCommand]:
    """The decision's state changes (each made by the kind's `state_changed`), then its
    commands: the order the outbox publishes them in (nothing that could lead to the node's
    next decision exists before its state change)."""
    saga = decision.saga
    first = saga.sequence - len(decision.transitions) + 1
    changes: list[StateChange[P] | IssuedCommand] = [
        StateChange(ids.transition(saga.saga_id, first + offset), state_changed(saga, move))
        for offset, move in enumerate(decision.transitions)
    ]
    return changes + list(decision.commands)


def admission_trigger(saga: SagaRecord[Any], event: Event) -> Trigger | None:
    """What `event` means to a saga whose admission carries nothing: `Admitted` for its own
    attempt's, None for another's, else the event itself."""
    if not isinstance(event, NodeAdmitted):
        return event
    if (event.saga_id, event.attempt) != (saga.saga_id, saga.attempt):
        return None
    return Admitted()


def fold_step(
    decide: Callable[[R, Trigger, GPUClusterPolicySpec, datetime], Decision[Any, Any]],
    trigger: Callable[[R, Event], Trigger | None],
    saga: R,
    event: Event,
    spec: GPUClusterPolicySpec,
    now: datetime,
) -> Decision[Any, Any] | None:
    """One step of a kind's fold: the decision about what `event` means to `saga` at `now`,
    or None when it means nothing or leaves the saga as it was (nothing is stored, published
    or done then)."""
    meaning = trigger(saga, event)
    if meaning is None:
        return None
    decision = decide(saga, meaning, spec, now)
    return None if decision.saga == saga else decision


def named_subjects(*names: tuple[str, str]) -> Callable[[str], tuple[str, ...]]:
    """The intake's subjects of the events named `(domain, name)`, under a bus prefix."""

    def subjects_of(prefix: str) -> tuple[str, ...]:
        return tuple(subjects.events_filter(d, name=n, prefix=prefix) for d, n in names)

    return subjects_of


def never(saga: Any) -> bool:
    """No saga of the kind settles."""
    return False


class NoPolicy(ValueError):
    """A start hook cannot build its saga without a policy, and none was recorded."""


@dataclass(frozen=True)
class Start(Generic[R]):
    """A saga built from the event that recorded its start, with the first decision the
    runtime carried out as it recorded it (None: the saga starts as built, nothing done)."""

    saga: R
    first: Decision[Any, Any] | None = None


@dataclass(frozen=True)
class Breaker:
    """A circuit breaker on a kind's starts (the remediation's `remediation.maxPerHour`):
    one rule for the live starter and for replay."""

    allows: Callable[[Sequence[datetime], datetime, int], bool]
    """Whether a start at `now` is allowed after the starts before it, under the limit."""
    limit: Callable[[GPUClusterPolicySpec | None], int]
    """The policy's limit (0: none)."""
    calls_for: Callable[[Event, GPUClusterPolicySpec | None], bool]
    """Whether an event asks for a start under the policy (a GPU's health: a reset)."""
    refused: type[Event]
    """The event that records a start the breaker refused."""
    noun: str
    """What a start starts, in words (`remediation`)."""
    setting: str
    """The policy setting of the limit, named in replay's reports."""
    cause: str
    """What an event asking for a start is, in words (`health event`)."""


@dataclass(frozen=True)
class SagaKind(Generic[R]):
    """One kind of saga, as the runtime and replay run it (see the module docstring)."""

    name: str
    """The kind's name (`gpu-remediation`): `NodeStatus.held_by` of the nodes it holds."""
    key_prefix: str
    """Its records' keys in `gpuop_sagas`: `<key_prefix>.<node token>`; empty: the bare
    node token (the upgrade's, as stored before there were other kinds)."""
    decode: Callable[[bytes | str], R]
    """A stored record, decoded; `ValueError` when it does not."""
    inbound: Callable[[Event], bool]
    """Whether the kind's sagas decide `event`."""
    subjects: Callable[[str], tuple[str, ...]]
    """The subjects (under a bus prefix) the intake consumes for it."""
    step: Callable[[R, Event, GPUClusterPolicySpec, datetime], Decision[Any, Any] | None]
    """The fold's one step: the decision, or None when the saga is left as it was."""
    state_changed: Callable[[R, Transition[Any]], Event]
    """The public state change (a `state_change`) of one of a saga's moves: what `outputs`
    publishes besides commands."""
    pending: Callable[[R, GPUClusterPolicySpec], Decision[Any, Any]]
    """What a stored saga issues again after a crash, with its original ids."""
    holds: Callable[[R], bool]
    """The saga holds its node now: unavailable to every other kind."""
    waiting: Callable[[R], bool]
    """The saga waits for an admission."""
    terminal: frozenset[Any]
    """The states in which a saga has ended: a new one may start on its node."""
    state_change: type[Event]
    """Its public state change (`NodeUpgradeStateChanged`, ...): what `outputs` publishes
    besides commands, and what replay compares as a transition."""
    started_by: type[Event]
    """The event that records a saga's start (`SagaStarted`, `RemediationStarted`, ...)."""
    start: Callable[[str, Any, GPUClusterPolicySpec | None, datetime], Start[R] | None]
    """The pure start hook: the saga `started_by` records on a node, built at its time
    under the policy; None when it starts nothing without a policy, `NoPolicy` when a
    policy must have been recorded, `ValueError` when the record cannot start one."""
    breaker: Breaker | None = None
    """The circuit breaker its starts are put to, if any."""
    trigger: Callable[[R, Event], Trigger | None] = admission_trigger
    """What an inbound event means to a saga; None: nothing (another attempt's admission)."""
    correlation: Callable[[R], str] = attrgetter("saga_id")
    """The correlation id of its public events (and its admissions' rollout id)."""
    settles: Callable[[R], bool] = never
    """Whether a saga is settled: its store's index counts it (`tallies.DoneSagas`, the
    upgrade's done sagas) instead of keeping it among those admission weighs."""

    def outputs(self, decision: Decision[Any, Any]) -> list[Output]:
        """What a decision publishes, with its ids, in the outbox's order (`outputs`)."""
        return list(outputs(decision, self.state_changed))

    def ended(self, saga: R) -> bool:
        """Whether the saga has ended: a new one may start on its node."""
        return saga.state in self.terminal

    def key(self, node: str) -> str:
        """The node's record's key in `gpuop_sagas`."""
        token = subjects.encode_node(node)
        return f"{self.key_prefix}.{token}" if self.key_prefix else token

    def owns(self, key: str) -> bool:
        """Whether `key` of `gpuop_sagas` is one of this kind's records (keys beginning
        with `_`, the leader's presence, are no kind's; node tokens never have a dot)."""
        if self.key_prefix:
            return key.startswith(f"{self.key_prefix}.")
        return not key.startswith("_") and "." not in key

    def node_of(self, key: str) -> str:
        """The node whose record `key` is (`owns(key)`)."""
        return subjects.decode_node(key[len(self.key_prefix) + 1 :] if self.key_prefix else key)
