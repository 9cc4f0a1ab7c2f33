"""The machinery every saga kind runs on: a table of states, one phase per state, a draft.

A saga kind (the driver upgrade is the first: `gpuop.saga.upgrade.kind.UPGRADE`; GPU remediation,
`gpuop.saga.remediation`, and MIG reconfiguration, `gpuop.saga.mig`, the others) is a
`Kind`: its states (a `StrEnum`), the table of the
moves between them, and one `Phase` per state, each the behaviour of that state written in
one module: what entering it does (`enter`), what an event means in it (`on_event`), what
its deadline's expiry does (`on_deadline`). The machinery is the same for every kind:

    decide     an event -> the phase of the saga's state (`on_event`), a current deadline
               -> `on_deadline` (a stale one changes nothing), a node removed -> the kind's
               `removed`; the kind's `observe` first, for bookkeeping in any state
    Draft      the decision being built: every move is checked against the kind's table,
               counted (`sequence`), announced (the kind's label and Kubernetes Event), and
               enters the next state's phase; `start` arms a step's deadline and issues its
               effects, with ids derived from the saga id, the step and the attempt
    Decision   the saga after the event, its commands, Kubernetes actions and moves

Everything after the decision is the runtime's, also shared by every kind: compare-and-set
persistence, the outbox, deadlines, admission under one `maxUnavailable` budget (a node held
by one kind's saga counts as unavailable to every other, `admission.NodeStatus.held_by`),
traces and replay. A new kind brings its states, table, phases, record and effects; it never
touches another kind's.

Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from types import MappingProxyType, ModuleType
from typing import Any, Generic, Protocol, Self, TypeVar

from gpuop.events import Command, Event, fields, ids, kube
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.envelope import StateChangedEvent
from gpuop.events.fields import DocumentedEnum
from gpuop.policy import GPUClusterPolicySpec

State = TypeVar("State", bound=StrEnum)
"""A kind's states."""
State_co = TypeVar("State_co", bound=StrEnum, covariant=True)


@dataclass(frozen=True)
class Admitted:
    """The admission pass (`gpuop.saga.admission`) gave this waiting saga a slot."""

    canary: bool = False
    """Admitted as one of the rollout's canary nodes."""
    components: tuple[str, ...] = ()
    """The part of the saga's work this admission lets it do, when admission narrowed it, in
    the kind's own terms (the driver upgrade: its components, less those a node skip label
    keeps out); empty: all of it."""


Trigger = Event | Admitted
"""What a saga decides on: any event from the log, or an admission."""


class IllegalTransition(RuntimeError):
    """A phase tried a move its kind's table does not have: a bug, never a node's fault."""


@dataclass(frozen=True)
class Transition(Generic[State]):
    """One move of a saga, as its phase made it."""

    from_state: State
    """State before."""
    to_state: State
    """State after."""
    reason: str
    """Why, in words (the event or deadline that caused it)."""
    attempt: int
    """The saga's attempt after the move."""


class StepLike(Protocol):
    """What the machinery reads of a kind's step: the token naming its deadline and ids."""

    @property
    def token(self) -> str: ...


class StepResult(DocumentedEnum):
    """How a step of a saga ended, in every kind's history of outcomes."""

    SUCCEEDED = "succeeded"
    """It did what it had to."""
    FAILED = "failed"
    """Its executor reported a failure."""
    EXPIRED = "expired"
    """Its deadline passed first."""
    SKIPPED = "skipped"
    """Nothing to do (no holders, drain disabled, no GPU to re-carve, node gone)."""


class StoredRecord(fields.Record):
    """Base of a kind's durable record: frozen, kept in KV as JSON."""

    def to_json(self) -> bytes:
        """The record as stored in KV."""
        return self.model_dump_json().encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> Self:
        """A record read back from KV."""
        return cls.model_validate_json(data)


class StepOutcome(Protocol):
    """The ended-step record a kind keeps in its saga's history."""


class SagaRecord(Protocol[State_co]):
    """What the machinery reads and writes of a kind's durable record (a frozen model)."""

    @property
    def saga_id(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def state(self) -> State_co: ...
    @property
    def attempt(self) -> int: ...
    @property
    def sequence(self) -> int: ...
    @property
    def step(self) -> StepLike: ...
    @property
    def step_started(self) -> datetime: ...
    @property
    def deadline(self) -> datetime | None: ...

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """The record with `update` applied (pydantic's)."""
        ...

    def ended(self, at: datetime, result: str, detail: str) -> Self:
        """The record with the pending step's outcome appended to its history."""
        ...


Record = TypeVar("Record", bound=SagaRecord[Any])
"""A kind's record."""


PublicChange = TypeVar("PublicChange", bound=StateChangedEvent)


def state_event(event: type[PublicChange], move: Transition[Any], **own: Any) -> PublicChange:
    """A kind's public `event` of `move`: its states, its attempt and its reason (cut to fit
    a `Message`), with the kind's `own` fields (the saga's id, its components, ...)."""
    moved = {
        "from_state": move.from_state,
        "to_state": move.to_state,
        "reason": move.reason[: fields.MESSAGE_MAX_LENGTH],
        "attempt": move.attempt,
    }
    return event.model_validate({**moved, **own})


@dataclass(frozen=True)
class IssuedCommand:
    """A command for a node agent, with the id it must be published under."""

    payload: Command
    id: str
    """`ids.step(saga_id, step, attempt)`: the same every time this step is decided."""
    step: str
    """The token the id was derived from."""
    attempt: int
    """The attempt the id was derived from."""


@dataclass(frozen=True)
class Decision(Generic[Record, State]):
    """What one event did to one saga."""

    saga: Record
    """The saga after the event: persist it (compare-and-set) before acting, when it differs
    from the one decided on (an ignored event returns that one unchanged)."""
    commands: tuple[IssuedCommand, ...] = ()
    """Node-agent commands to publish, in order."""
    kube_actions: tuple[Any, ...] = ()
    """Kubernetes actions to execute, in order (the kind's action types)."""
    transitions: tuple[Transition[State], ...] = ()
    """State moves made, in order; each is published as the kind's public state change."""


Draft_ = TypeVar("Draft_", bound="Draft[Any, Any]")


Effects = tuple[tuple[IssuedCommand, ...], tuple[Any, ...]]
"""The commands and Kubernetes actions that start a step."""


def no_effects(saga: Any, spec: GPUClusterPolicySpec) -> Effects:
    """What a step that only waits issues: nothing."""
    return (), ()


@dataclass(frozen=True)
class Phase(Generic[Record, Draft_]):
    """The behaviour of one state: entering it, an event in it, its deadline passing, and
    what its steps issue."""

    enter: Callable[[Draft_, bool], None]
    """Called by `Draft.move` on entry; the flag is False when the move ends the saga for
    good (no retry). Starts the state's first step, or moves on when there is nothing to do."""
    on_event: Callable[[Draft_, Trigger], None]
    """An event (or an admission) while in the state; most are not for it and change nothing."""
    on_deadline: Callable[[Draft_, DeadlineExpired], None]
    """The pending step's deadline passed (the machinery dropped stale ones already)."""
    effects: Callable[[Record, GPUClusterPolicySpec], Effects] = no_effects
    """The commands and Kubernetes actions that start the saga's pending step in this state,
    with ids from the saga id, the step and the attempt: `Draft.start` issues them, and the
    runtime issues them again, the same, for a saga it reads back after a crash."""


def phases_of(modules: Iterable[ModuleType]) -> Mapping[Any, Phase[Any, Any]]:
    """A kind's phase registry: each phase module's `STATE` -> its `enter`, `on_event`,
    `on_deadline` and `effects` (every kind's `phases` package hands its modules here)."""
    return MappingProxyType(
        {
            module.STATE: Phase(
                enter=module.enter,
                on_event=module.on_event,
                on_deadline=module.on_deadline,
                effects=module.effects,
            )
            for module in modules
        }
    )


def overdue(draft: Draft[Any, Any]) -> str:
    """Why the pending step failed on its deadline, in words (every kind's)."""
    saga = draft.saga
    if saga.deadline is None:
        raise ValueError(f"{saga.step.token} has no deadline to be overdue on")
    seconds = (saga.deadline - saga.step_started).total_seconds()
    return f"{saga.step.token} did not finish within {seconds:g} s"


def ignore(draft: Draft[Any, Any], trigger: Trigger | DeadlineExpired) -> None:
    """A phase's answer to what it does not wait for."""


@dataclass(frozen=True)
class Kind(Generic[Record, State, Draft_]):
    """One kind of saga: its states, moves, phases and the hooks the machinery calls."""

    name: str
    """`driver-upgrade`: the kind's name in records, traces and notes."""
    table: Mapping[State, Mapping[State, str]]
    """State -> the states it may move to -> the trigger of that move."""
    phases: Mapping[State, Phase[Record, Draft_]]
    """The behaviour of each state; `check` proves every state has one."""
    retry_state: State
    """Entering it starts the next attempt (the attempt counts up)."""
    observe: Callable[[Draft_, Event], None]
    """Bookkeeping before the phase sees an event, whatever the state."""
    removed: Callable[[Draft_], None]
    """The node object is gone."""
    announce: Callable[[Record, Transition[State]], tuple[Any, ...]]
    """The Kubernetes actions that make a move visible (a state label, an Event), for the
    saga as it is right after the move."""
    limit: Callable[[Record, Any, GPUClusterPolicySpec], float | None]
    """Seconds a step (a `step_type`) may take; None for a step without a deadline."""
    step_type: type[Any] = object
    """The class of the kind's steps; `start` refuses any other (a bug in a phase)."""

    def check(self) -> None:
        """Raise `ValueError` unless the table and the phases cover the same states, every
        state of the kind, and every move lands on one of them."""
        states = set(type(self.retry_state))
        if set(self.table) != states:
            raise ValueError(f"{self.name}: table rows {sorted(self.table)} != {sorted(states)}")
        if set(self.phases) != states:
            missing = sorted(states - set(self.phases))
            raise ValueError(f"{self.name}: states without a phase: {missing}")
        for source, nexts in self.table.items():
            for target, trigger in nexts.items():
                if target not in states or not trigger.strip():
                    raise ValueError(f"{self.name}: bad move {source} -> {target}")

    def effects(self, saga: Record, spec: GPUClusterPolicySpec) -> Effects:
        """What the saga's pending step issues (its state's phase says)."""
        return self.phases[saga.state].effects(saga, spec)

    def pending(
        self, saga: Record, spec: GPUClusterPolicySpec, *first: Any
    ) -> Decision[Record, State]:
        """What to issue again for a saga read back after a crash: the Kubernetes actions
        `first` (a state label) before its pending step's, the step's commands, and the
        public events of its latest transitions, with the ids they had when first issued
        (the bus drops what was published already)."""
        commands, actions = self.effects(saga, spec)
        transitions: tuple[Transition[State], ...] = getattr(saga, "last_transitions", ())
        return Decision(
            saga=saga, commands=commands, kube_actions=(*first, *actions), transitions=transitions
        )

    def deadline_seconds(
        self, saga: Record, step: StepLike, spec: GPUClusterPolicySpec
    ) -> float | None:
        """`limit` for a step of this kind; raise `TypeError` for a step of another."""
        if not isinstance(step, self.step_type):
            raise TypeError(
                f"{self.name}: a step is a {self.step_type.__name__}, not {type(step).__name__}"
            )
        return self.limit(saga, step, spec)

    def require(self, from_state: State, to_state: State) -> None:
        """Raise `IllegalTransition` unless the table has the move."""
        if to_state not in self.table[from_state]:
            raise IllegalTransition(
                f"{self.name}: no transition {from_state} -> {to_state} in the table"
            )


class Draft(Generic[Record, State]):
    """A saga being decided on; `decision()` is the result. A kind may subclass it to add
    the helpers its phases share."""

    def __init__(
        self,
        kind: Kind[Record, State, Self],
        saga: Record,
        spec: GPUClusterPolicySpec,
        now: datetime,
    ) -> None:
        self.kind: Kind[Record, State, Self] = kind
        self.saga = saga
        self.spec = spec
        self.now = now
        self.commands: list[IssuedCommand] = []
        self.actions: list[Any] = []
        self.transitions: list[Transition[State]] = []

    def decision(self) -> Decision[Record, State]:
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
        return action_id(self.saga)

    def outcome(self, result: StrEnum, detail: str) -> None:
        """Record how the pending step ended."""
        self.saga = self.saga.ended(self.now, result, detail[:2048])

    def start(self, step: StepLike) -> None:
        """Make `step` the pending one: arm its deadline and issue its effects."""
        self.update(step=step, step_started=self.now)
        limit = self.kind.deadline_seconds(self.saga, step, self.spec)
        self.update(deadline=None if limit is None else self.now + timedelta(seconds=limit))
        commands, actions = self.kind.effects(self.saga, self.spec)
        self.commands.extend(commands)
        self.actions.extend(actions)

    def move(self: Self, to_state: State, reason: str, *, retry: bool = True) -> None:
        """Move to `to_state` (the table must have it) and enter its phase; `retry` False
        makes the end final (the node is gone)."""
        saga = self.saga
        self.kind.require(saga.state, to_state)
        attempt = saga.attempt + 1 if to_state == self.kind.retry_state else saga.attempt
        self.update(state=to_state, sequence=saga.sequence + 1, attempt=attempt)
        transition = Transition(saga.state, to_state, reason, attempt)
        self.transitions.append(transition)
        self.actions.extend(self.kind.announce(self.saga, transition))
        self.kind.phases[to_state].enter(self, retry)

    def take(self, step: StepLike) -> None:
        """Make `step` the pending one with no deadline and nothing issued: a step decided
        at once, or a final state's."""
        self.update(step=step, step_started=self.now, deadline=None)

    def skip(self, step: StepLike, to_state: State, result: StrEnum, reason: str) -> None:
        """Pass through a state whose step has nothing to do: the step is recorded as
        skipped (still a move, in the table and in the trail) and the saga moves on."""
        self.take(step)
        self.outcome(result, reason)
        self.move(to_state, reason)


def issue(saga: SagaRecord[Any], payload: Command, token: str | None = None) -> IssuedCommand:
    """`payload` under the id of `token` (default: the pending step's) in the saga's attempt,
    every kind's: the same id every time the step is decided."""
    token = token or saga.step.token
    return IssuedCommand(
        payload=payload,
        id=ids.step(saga.saga_id, token, saga.attempt),
        step=token,
        attempt=saga.attempt,
    )


def action_id(saga: SagaRecord[Any], token: str | None = None) -> str:
    """The id of the Kubernetes action of `token` (default: the pending step's) in the saga's
    attempt."""
    return ids.step(saga.saga_id, token or saga.step.token, saga.attempt)


def deadline_event(saga: SagaRecord[Any]) -> DeadlineExpired | None:
    """The `DeadlineExpired` the runtime publishes when the saga's deadline passes, whatever
    its kind; None when the pending step has no deadline. Schedule it for `saga.deadline`."""
    if saga.deadline is None:
        return None
    return DeadlineExpired(
        saga_id=saga.saga_id,
        state=saga.state,
        step=saga.step.token,
        attempt=saga.attempt,
        deadline=saga.deadline,
    )


def current(saga: SagaRecord[Any], expired: DeadlineExpired) -> bool:
    """Whether `expired` guards the saga's pending step (not a step it has left)."""
    now = (saga.saga_id, saga.state, saga.step.token, saga.attempt)
    return saga.deadline is not None and (
        (expired.saga_id, expired.state, expired.step, expired.attempt) == now
    )


def decide(draft: Draft_, trigger: Trigger) -> Draft_:
    """Fold `trigger` into the draft's saga through its kind; `draft.decision()` is the
    result (returned for chaining)."""
    kind = draft.kind
    state = draft.saga.state
    if isinstance(trigger, DeadlineExpired):
        if current(draft.saga, trigger):
            kind.phases[state].on_deadline(draft, trigger)
    elif isinstance(trigger, kube.NodeRemoved):
        kind.removed(draft)
    else:
        if isinstance(trigger, Event):
            kind.observe(draft, trigger)
        kind.phases[state].on_event(draft, trigger)
    return draft
