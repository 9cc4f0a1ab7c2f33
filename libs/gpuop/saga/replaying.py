"""Replay of a recorded log through a fresh decision core (`gpuop replay`), pure.

The export (`gpuop events export`) is JSON lines, one stored message per line, in time order:

    {"stream": "GPUOP_EVENTS", "seq": 42, "subject": "gpuop.evt.kube.node-1.cordoned",
     "time": "2026-11-29T20:00:01.5+00:00", "message": {...the CloudEvents envelope...}}

`stream` and `seq` are the JetStream stream and sequence, `subject` the NATS subject, `time`
when the server stored it, `message` the envelope exactly as published. `export_line` writes
one line and `parse_log` reads them back.

`replay` folds the events of the log, in stream order, with each event's recorded time,
through the same folds the runtime uses, one per kind of `registry.KINDS` (it names none):
the event that records a kind's start (`SagaKind.started_by`) builds the node's saga of that
kind with the kind's pure start hook (`SagaKind.start`; a MIG reconfiguration's carries its
plan, so it is rebuilt without the ConfigMap, with the first decision the runtime carried out
as it recorded it); then every later event is decided for the node's saga of each kind that
consumes it (`SagaKind.inbound`, `SagaKind.step`), in `KINDS`' order, and `SagaKind.outputs`
names what each decision publishes.

A kind whose starts a circuit breaker limits (`SagaKind.breaker`: the GPU remediation's
`remediation.maxPerHour`) is checked as the starter checks it: a start the breaker would
have refused is reported (`Replayed.refused`); a recorded refusal must be refused again (one
the breaker would have started is reported: `Replayed.allowed`); and an event that calls for
a start (`Breaker.calls_for`: a health event) on a node without a saga of the kind running,
which the log neither started nor refused, is reported when the breaker refuses it
(`_missing_refusals`: the refusal is missing from the log). The starter puts to the breaker
only events about GPU nodes the orchestrator's node watch knows (`kinds.is_a_node` and the
controller's `_watched`), and the log records what the watch knew: each node it lists is a
`NodeObserved` and each it loses a `NodeRemoved` (`Watched`). So an event is put to the
breaker only when its node was observed and not removed before it, or, before the log
records any observation (the watch had not listed the nodes yet: the starter takes any node
then), when it is about a node at all.

The policy is the latest `PolicyApplied` (one that names an event as its cause was applied
just before that event was decided), unless an override replaces every recorded one.
`compare` then sets the commands and state changes it produced against the recorded ones,
node by node. `Replayed.events` counts each event folded: one that started, refused or built
a saga of any kind, or that a kind's saga took (its trigger meant something to it), once
however many kinds took it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from gpuop.events import Envelope, Event, Payload, decode_on, documents, subjects
from gpuop.events.envelope import MalformedMessage, SubjectMismatch, UnknownEventType
from gpuop.events.kube import NodeObserved, NodeRemoved
from gpuop.events.upgrade import PolicyApplied
from gpuop.policy import GPUClusterPolicySpec, PolicyInvalid, validate_spec
from gpuop.saga import kinds
from gpuop.saga.kinds import SagaKind
from gpuop.saga.registry import KINDS

EVENTS_STREAM = "GPUOP_EVENTS"
COMMANDS_STREAM = "GPUOP_COMMANDS"
DIFF_LIMIT = 3
"""Divergences shown per node."""


class ReplayInputError(ValueError):
    """The export cannot be replayed; the message names the line."""


class MisplacedMessages(ReplayInputError):
    """Messages of the export travel on subjects their types and nodes do not declare
    (`check_subject`): forged by whoever could publish there, or corrupt. Replay believes no
    log holding one; the message names every such line."""


@dataclass(frozen=True)
class Recorded:
    """One line of an export, decoded."""

    line: int
    stream: str
    seq: int
    subject: str
    envelope: Envelope
    payload: Payload | None
    """None for a type this version does not know (replay skips it)."""


@dataclass(frozen=True)
class Output:
    """A command or a state change, recorded or produced by the replay."""

    kind: str
    """`command` or `transition`."""
    id: str
    type: str
    data: dict[str, Any]

    def describe(self) -> str:
        return f"{self.kind} {self.type} id={self.id} {json.dumps(self.data, sort_keys=True)}"


Outputs = dict[str, list[Output]]
"""Node -> outputs in order."""


@dataclass
class Replayed:
    """What the replay produced."""

    events: int = 0
    """Events folded: each that started, refused or built a saga, or that a kind decided."""
    nodes: set[str] = field(default_factory=set)
    outputs: Outputs = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    """Remediations the log started that the circuit breaker would have refused."""
    allowed: list[str] = field(default_factory=list)
    """Refusals in the log that the circuit breaker would have started."""
    unrecorded: list[str] = field(default_factory=list)
    """Health events the circuit breaker refuses whose refusal the log does not record."""

    @property
    def breaker_differs(self) -> bool:
        """Whether the replayed circuit breaker decided any start otherwise than the log."""
        return bool(self.refused or self.allowed or self.unrecorded)


@dataclass
class Watched:
    """The GPU nodes the orchestrator's node watch knew, as far as the log has told so far."""

    nodes: set[str] = field(default_factory=set)
    listed: bool = False
    """The log recorded an observation: the watch had listed the nodes."""

    def see(self, payload: Payload | None, node: str) -> None:
        if isinstance(payload, NodeObserved):
            self.listed = True
            self.nodes.add(node)
        elif isinstance(payload, NodeRemoved):
            self.listed = True
            self.nodes.discard(node)

    def knows(self, node: str) -> bool:
        """Whether the starter would take an event about `node` (as `_watched`)."""
        if not self.listed:
            return node != subjects.CLUSTER
        return node in self.nodes


@dataclass(frozen=True)
class Comparison:
    """Recorded against replayed outputs."""

    commands: int
    transitions: int
    divergences: dict[str, list[str]]
    """Node -> readable lines (expected vs got), the first `DIFF_LIMIT` per node."""

    @property
    def identical(self) -> bool:
        return not self.divergences

    def report(self) -> str:
        lines = []
        for node in sorted(self.divergences):
            lines.append(f"node {node}:")
            lines.extend(f"  {line}" for line in self.divergences[node])
        return "\n".join(lines)


def export_line(stream: str, seq: int, subject: str, time: datetime, data: bytes) -> str:
    """One line of the export; raises `ValueError` when `data` is not a JSON object."""
    try:
        message = documents.json_object(data)
    except ValueError as exc:
        raise ValueError(f"{stream} #{seq} is {exc}") from None
    line = {
        "stream": stream,
        "seq": seq,
        "subject": subject,
        "time": time.isoformat(),
        "message": message,
    }
    return json.dumps(line, separators=(",", ":"))


def parse_log(lines: Iterable[str]) -> list[Recorded]:
    """The export's lines decoded, in stream order; `ReplayInputError` names a bad line,
    `MisplacedMessages` every line whose subject its type and node do not declare."""
    log = []
    misplaced: list[str] = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            line = documents.json_object(text)
        except ValueError as exc:
            raise ReplayInputError(f"line {number}: {exc}") from None
        stream, seq, subject = line.get("stream"), line.get("seq"), line.get("subject")
        message = line.get("message")
        if stream not in (EVENTS_STREAM, COMMANDS_STREAM):
            raise ReplayInputError(f"line {number}: unknown stream {stream!r}")
        if not isinstance(seq, int) or not isinstance(subject, str):
            raise ReplayInputError(f"line {number}: needs an integer seq and a subject")
        if not isinstance(message, dict):
            raise ReplayInputError(f"line {number}: needs a message object")
        payload: Payload | None
        try:
            envelope, payload = decode_on(subject, json.dumps(message).encode())
        except UnknownEventType:
            envelope, payload = Envelope.model_validate(message), None
        except SubjectMismatch as exc:
            misplaced.append(f"line {number} ({stream} #{seq}): {exc}")
            continue
        except MalformedMessage as exc:
            raise ReplayInputError(f"line {number}: {exc}") from None
        log.append(Recorded(number, stream, seq, subject, envelope, payload))
    if misplaced:
        raise MisplacedMessages(
            f"{len(misplaced)} messages travel on subjects their types and nodes do not "
            "declare (forged or corrupt; nothing was replayed):\n  " + "\n  ".join(misplaced)
        )
    log.sort(key=lambda r: (r.stream, r.seq))
    return log


def load_policy(document: object, where: str) -> GPUClusterPolicySpec:
    """A `GPUClusterPolicy` object or its bare spec, parsed from JSON or YAML."""
    if isinstance(document, Mapping) and "driver" not in document and "spec" in document:
        document = document["spec"]
    if not isinstance(document, Mapping):
        raise ReplayInputError(f"{where}: not a GPUClusterPolicy spec")
    try:
        return validate_spec(document)
    except PolicyInvalid as exc:
        raise ReplayInputError(f"{where}: {exc}") from None


def _kind(out: object) -> str:
    return "transition" if isinstance(out, kinds.StateChange) else "command"


def _dump(payload: BaseModel) -> dict[str, Any]:
    return payload.model_dump(mode="json")


def _as_outputs(outputs: Iterable[kinds.Output]) -> list[Output]:
    return [Output(_kind(out), out.id, out.payload.TYPE, _dump(out.payload)) for out in outputs]


def recorded_outputs(log: Sequence[Recorded]) -> Outputs:
    """The commands and state changes in the log, per node, once per id."""
    changes = tuple(kind.state_change for kind in KINDS)
    seen: set[str] = set()
    outputs: Outputs = {}
    for entry in log:
        payload = entry.payload
        if entry.stream == COMMANDS_STREAM:
            kind_ = "command"
        elif isinstance(payload, changes):
            kind_ = "transition"
        else:
            continue
        if payload is None or entry.envelope.id in seen:
            continue
        seen.add(entry.envelope.id)
        output = Output(kind_, entry.envelope.id, entry.envelope.type, _dump(payload))
        outputs.setdefault(entry.envelope.node, []).append(output)
    return outputs


def replay(log: Sequence[Recorded], policy: GPUClusterPolicySpec | None = None) -> Replayed:
    """Feed the log's inbound events to a fresh core; `policy` replaces the recorded ones."""
    events = [r for r in log if r.stream == EVENTS_STREAM and r.payload is not None]
    folder = _Folder(events, policy)
    for index, entry in enumerate(events):
        folder.fold(index, entry)
    folder.result.unrecorded = _missing_refusals(events, folder.undecided)
    return folder.result


class _Folder:
    """One replay's state: the sagas of every kind per node, the starts each breaker counts,
    and the policy in force."""

    def __init__(self, events: Sequence[Recorded], policy: GPUClusterPolicySpec | None) -> None:
        self.override = policy
        self.current = policy
        self.caused = {
            r.envelope.causationid: r
            for r in events
            if isinstance(r.payload, PolicyApplied) and r.envelope.causationid
        }
        self.result = Replayed()
        self.sagas: dict[str, dict[str, Any]] = {kind.name: {} for kind in KINDS}
        self.starts: dict[str, list[datetime]] = {kind.name: [] for kind in KINDS}
        self.starting: dict[type[Any], SagaKind[Any]] = {k.started_by: k for k in KINDS}
        self.refusing: dict[type[Any], SagaKind[Any]] = {
            k.breaker.refused: k for k in KINDS if k.breaker
        }
        self.decided = {
            r.envelope.causationid
            for r in events
            if isinstance(r.payload, tuple(self.starting) + tuple(self.refusing))
            and r.envelope.causationid
        }
        self.undecided: list[tuple[int, SagaKind[Any], int]] = []
        self.watched = Watched()

    def fold(self, index: int, entry: Recorded) -> None:
        """Fold one recorded event."""
        payload, envelope = entry.payload, entry.envelope
        self.watched.see(payload, envelope.node)
        if isinstance(payload, PolicyApplied):
            if self.override is None and not envelope.causationid:
                self.current = load_policy(payload.spec, f"line {entry.line}")
            return
        if self.override is None and envelope.id in self.caused:
            applied = self.caused[envelope.id]
            assert isinstance(applied.payload, PolicyApplied)
            self.current = load_policy(applied.payload.spec, f"line {applied.line}")
        starting = self.starting.get(type(payload))
        if starting is not None:
            self._start(starting, entry)
            return
        refusing = self.refusing.get(type(payload))
        if refusing is not None:
            self._refused(refusing, entry)
            return
        for kind in KINDS:
            if kind.breaker is not None and self._undecided(kind, kind.breaker, entry):
                limit = kind.breaker.limit(self.current)
                self.undecided.append((index, kind, limit))
        if isinstance(payload, Event) and self.current is not None:
            self.result.events += self._decide(envelope, payload, self.current)

    def _start(self, kind: SagaKind[Any], entry: Recorded) -> None:
        """A kind's start: its saga built by the kind's start hook, put to its breaker."""
        envelope = entry.envelope
        try:
            start = kind.start(envelope.node, entry.payload, self.current, envelope.time)
        except kinds.NoPolicy:
            raise ReplayInputError(
                f"line {entry.line}: no policy recorded before it; pass --policy"
            ) from None
        except ValueError as exc:  # ValidationError is one
            raise ReplayInputError(f"line {entry.line}: cannot start the saga: {exc}") from None
        if start is None:
            return
        if kind.breaker is not None:
            limit = kind.breaker.limit(self.current)
            if not kind.breaker.allows(self.starts[kind.name], envelope.time, limit):
                self.result.refused.append(
                    f"line {entry.line}: {start.saga.saga_id} started with {limit} "
                    f"{kind.breaker.noun}s in the hour before ({kind.breaker.setting})"
                )
            self.starts[kind.name].append(envelope.time)
        self.sagas[kind.name][envelope.node] = start.saga
        self.result.nodes.add(envelope.node)
        self.result.events += 1
        if start.first is not None:  # the runtime carried it out as it recorded the start
            self._publish(envelope.node, kind.outputs(start.first))

    def _refused(self, kind: SagaKind[Any], entry: Recorded) -> None:
        """A start the kind's breaker refused: it must refuse it again."""
        breaker, node = kind.breaker, entry.envelope.node
        assert breaker is not None
        limit = breaker.limit(self.current)
        if breaker.allows(self.starts[kind.name], entry.envelope.time, limit):
            self.result.allowed.append(
                f"line {entry.line}: a {breaker.noun} of {node} refused with fewer "
                f"than {limit} in the hour before ({breaker.setting})"
            )
        self.result.nodes.add(node)
        self.result.events += 1

    def _undecided(self, kind: SagaKind[Any], breaker: kinds.Breaker, entry: Recorded) -> bool:
        """Whether `entry` is an event the runtime's starter would have put to the kind's
        breaker, and the log records no start or refusal for."""
        payload, node = entry.payload, entry.envelope.node
        if not isinstance(payload, Event) or entry.envelope.id in self.decided:
            return False
        if not self.watched.knows(node):
            return False  # about no GPU node the watch knew: the starter puts it to no breaker
        if not breaker.calls_for(payload, self.current):
            return False
        running = self.sagas[kind.name].get(node)
        return running is None or kind.ended(running)

    def _decide(self, envelope: Envelope, event: Event, policy: GPUClusterPolicySpec) -> bool:
        """Decide `event` for the node's saga of every kind that consumes it, in `KINDS`'
        order; whether any kind's saga took it (its trigger meant something)."""
        folded = False
        for kind in KINDS:
            saga = self.sagas[kind.name].get(envelope.node)
            if saga is None or not kind.inbound(event) or kind.trigger(saga, event) is None:
                continue
            folded = True
            decision = kind.step(saga, event, policy, envelope.time)
            if decision is not None:
                self.sagas[kind.name][envelope.node] = decision.saga
                self._publish(envelope.node, kind.outputs(decision))
        return folded

    def _publish(self, node: str, outputs: Iterable[kinds.Output]) -> None:
        self.result.outputs.setdefault(node, []).extend(_as_outputs(outputs))


def _missing_refusals(
    events: Sequence[Recorded], undecided: Sequence[tuple[int, SagaKind[Any], int]]
) -> list[str]:
    """The undecided events (index in `events`, the kind, its limit) its breaker refuses.

    The starter decides in stream order, after the event is stored, so a start decided
    before an event is one recorded, or caused by an event stored, before it; and the
    starter's clock then was no earlier than those starts. A node whose start was decided
    before the event but recorded after it had a saga of the kind running: not put to the
    breaker."""
    where = {r.envelope.id: i for i, r in enumerate(events)}
    missing = []
    for index, kind, limit in undecided:
        breaker = kind.breaker
        assert breaker is not None
        starts = [
            (min(i, where.get(r.envelope.causationid or "", i)), i, r)
            for i, r in enumerate(events)
            if isinstance(r.payload, kind.started_by)
        ]
        entry = events[index]
        node = entry.envelope.node
        if any(d < index < i and r.envelope.node == node for d, i, r in starts):
            continue
        before = [r.envelope.time for d, _, r in starts if d < index]
        now = max([entry.envelope.time, *before])
        if not breaker.allows(before, now, limit):
            missing.append(
                f"line {entry.line}: {node}'s {breaker.cause} {entry.envelope.id} called for "
                f"a {breaker.noun} the circuit breaker refuses, and the log records no refusal"
            )
    return missing


def compare(expected: Outputs, got: Outputs) -> Comparison:
    """Recorded (`expected`) against replayed (`got`) outputs, per node and kind, in order."""
    divergences: dict[str, list[str]] = {}
    counts = {"command": 0, "transition": 0}
    for node in sorted(set(expected) | set(got)):
        lines: list[str] = []
        for kind in ("command", "transition"):
            want = [o for o in expected.get(node, []) if o.kind == kind]
            have = [o for o in got.get(node, []) if o.kind == kind]
            counts[kind] += len(want)
            for index in range(max(len(want), len(have))):
                w = want[index] if index < len(want) else None
                h = have[index] if index < len(have) else None
                if w == h:
                    continue
                lines.append(f"{kind} #{index + 1}:")
                lines.append(f"  expected: {w.describe() if w else '(none)'}")
                lines.append(f"  got:      {h.describe() if h else '(none)'}")
                break  # after the first divergence the rest follow from it
        if lines:
            divergences[node] = lines[: DIFF_LIMIT * 3]
    return Comparison(counts["command"], counts["transition"], divergences)


def summary(replayed: Replayed, comparison: Comparison) -> str:
    """The one line printed when the replay reproduced the log."""
    return (
        f"replayed {replayed.events} events for {len(replayed.nodes)} nodes: "
        f"{comparison.commands} commands and {comparison.transitions} transitions identical"
    )
