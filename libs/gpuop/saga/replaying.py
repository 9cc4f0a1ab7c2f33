"""Replay of a recorded log through a fresh decision core (`gpuop replay`), pure.

The export (`gpuop events export`) is JSON lines, one stored message per line, in time order:

    {"stream": "GPUOP_EVENTS", "seq": 42, "subject": "gpuop.evt.kube.node-1.cordoned",
     "time": "2026-11-29T20:00:01.5+00:00", "message": {...the CloudEvents envelope...}}

`stream` and `seq` are the JetStream stream and sequence, `subject` the NATS subject, `time`
when the server stored it, `message` the envelope exactly as published. `export_line` writes
one line and `parse_log` reads them back.

`replay` folds the inbound events (`folding.is_inbound`: what the orchestrator's intake
consumes), in stream order, with each event's recorded time, through the same `folding` the
runtime uses: `SagaStarted` builds a node's saga (`folding.started_saga`), `folding.step`
decides, and `folding.outputs` names what each decision publishes. A GPU remediation
(`gpuop.saga.remediation`) replays alike, beside the node's upgrade: `RemediationStarted`
builds it (`records.start`), after the circuit breaker's decision is checked against the
starts before it (`breaker.allows`: a start it would have refused is reported); a
`RemediationRefused` must be refused again (one the breaker would have started is reported),
and a health event calling for a remediation (`kind.calls_for_remediation`) on a node
without one running, which the log neither started nor refused, is reported when the breaker
refuses it (`_missing_refusals`: the refusal is missing from the log). The starter puts to
the breaker only events about GPU nodes the orchestrator's node watch knows
(`kinds.is_a_node` and the controller's `_watched`), and the log records what the watch knew:
each node it lists is a `NodeObserved` and each it loses a `NodeRemoved` (`Watched`). So a
health event is put to the breaker only when its node was observed and not removed before it,
or, before the log records any observation (the watch had not listed the nodes yet: the
starter takes any node then), when it is about a node at all. The remediation's
fold (`kind.step`, `kind.outputs`) decides each event it consumes after the upgrade's. A MIG
reconfiguration (`gpuop.saga.mig`) too: `MigReconfigurationStarted` carries its plan, so it
is rebuilt without the ConfigMap (`mig.folding.started`), its first decision made as the
runtime made it (`mig.kind.begin`), then `mig.folding.step` decides after the remediation's.
The policy is the latest `PolicyApplied` (one that names an event as its cause was applied
just before that event was decided), unless an override replaces every recorded one.
`compare` then sets the commands and state changes it produced against the recorded ones,
node by node. `Replayed.events` counts each event folded: one that started, refused or built
a saga of any kind, or that a kind's fold decided, once however many kinds decided it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from gpuop.events import Envelope, Event, Payload, decode, subjects
from gpuop.events.device import DeviceHealthChanged
from gpuop.events.envelope import MalformedMessage, UnknownEventType
from gpuop.events.kube import NodeObserved, NodeRemoved
from gpuop.events.mig import MigReconfigurationStarted, NodeMigStateChanged
from gpuop.events.remediation import (
    TERMINAL_STATES,
    NodeRemediationStateChanged,
    RemediationRefused,
    RemediationStarted,
)
from gpuop.events.upgrade import NodeUpgradeStateChanged, PolicyApplied, SagaStarted
from gpuop.policy import GPUClusterPolicySpec, PolicyInvalid, validate_spec
from gpuop.saga import folding
from gpuop.saga.mig import folding as mig_folding
from gpuop.saga.mig import kind as mig_kind
from gpuop.saga.mig.records import MigSaga
from gpuop.saga.records import NodeSaga
from gpuop.saga.remediation import breaker, records
from gpuop.saga.remediation import kind as remediation
from gpuop.saga.remediation.records import RemediationSaga

EVENTS_STREAM = "GPUOP_EVENTS"
COMMANDS_STREAM = "GPUOP_COMMANDS"
DIFF_LIMIT = 3
"""Divergences shown per node."""


class ReplayInputError(ValueError):
    """The export cannot be replayed; the message names the line."""


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
        message = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        # nesting too deep to parse is hostile input too: a line left out, not a crash
        raise ValueError(f"{stream} #{seq} is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ValueError(f"{stream} #{seq} is not a JSON object")
    line = {
        "stream": stream,
        "seq": seq,
        "subject": subject,
        "time": time.isoformat(),
        "message": message,
    }
    return json.dumps(line, separators=(",", ":"))


def parse_log(lines: Iterable[str]) -> list[Recorded]:
    """The export's lines decoded, in stream order; `ReplayInputError` names a bad line."""
    log = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ReplayInputError(f"line {number}: not JSON ({exc})") from None
        if not isinstance(line, dict):
            raise ReplayInputError(f"line {number}: not a JSON object")
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
            envelope, payload = decode(json.dumps(message).encode())
        except UnknownEventType:
            envelope, payload = Envelope.model_validate(message), None
        except MalformedMessage as exc:
            raise ReplayInputError(f"line {number}: {exc}") from None
        log.append(Recorded(number, stream, seq, subject, envelope, payload))
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
    return (
        "transition"
        if isinstance(out, folding.StateChange | remediation.StateChange | mig_folding.StateChange)
        else "command"
    )


def _dump(payload: BaseModel) -> dict[str, Any]:
    return payload.model_dump(mode="json")


def recorded_outputs(log: Sequence[Recorded]) -> Outputs:
    """The commands and state changes in the log, per node, once per id."""
    seen: set[str] = set()
    outputs: Outputs = {}
    for entry in log:
        payload = entry.payload
        if entry.stream == COMMANDS_STREAM:
            kind_ = "command"
        elif isinstance(
            payload, NodeUpgradeStateChanged | NodeRemediationStateChanged | NodeMigStateChanged
        ):
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
    caused = {
        r.envelope.causationid: r
        for r in events
        if isinstance(r.payload, PolicyApplied) and r.envelope.causationid
    }
    result = Replayed()
    current = policy
    sagas: dict[str, NodeSaga] = {}
    remediations: dict[str, RemediationSaga] = {}
    reconfigurations: dict[str, MigSaga] = {}
    starts: list[datetime] = []
    decided = {
        r.envelope.causationid
        for r in events
        if isinstance(r.payload, RemediationStarted | RemediationRefused) and r.envelope.causationid
    }
    undecided: list[tuple[int, int]] = []
    watched = Watched()
    for index, entry in enumerate(events):
        payload, envelope = entry.payload, entry.envelope
        watched.see(payload, envelope.node)
        if isinstance(payload, PolicyApplied):
            if policy is None and not envelope.causationid:
                current = load_policy(payload.spec, f"line {entry.line}")
            continue
        if policy is None and envelope.id in caused:
            applied = caused[envelope.id]
            assert isinstance(applied.payload, PolicyApplied)
            current = load_policy(applied.payload.spec, f"line {applied.line}")
        if isinstance(payload, SagaStarted):
            if current is None:
                raise ReplayInputError(
                    f"line {entry.line}: no policy recorded before it; pass --policy"
                )
            sagas[envelope.node] = _started(envelope, payload, current, entry.line)
            result.nodes.add(envelope.node)
            result.events += 1
            continue
        if isinstance(payload, RemediationStarted):
            limit = current.remediation.max_per_hour if current is not None else 0
            if not breaker.allows(starts, envelope.time, limit):
                result.refused.append(
                    f"line {entry.line}: {payload.saga_id} started with {limit} "
                    "remediations in the hour before (remediation.maxPerHour)"
                )
            starts.append(envelope.time)
            remediations[envelope.node] = records.start(envelope.node, payload, envelope.time)
            result.nodes.add(envelope.node)
            result.events += 1
            continue
        if isinstance(payload, RemediationRefused):
            limit = current.remediation.max_per_hour if current is not None else 0
            if breaker.allows(starts, envelope.time, limit):
                result.allowed.append(
                    f"line {entry.line}: a remediation of {envelope.node} refused with fewer "
                    f"than {limit} in the hour before (remediation.maxPerHour)"
                )
            result.nodes.add(envelope.node)
            result.events += 1
            continue
        if _undecided(entry, remediations.get(envelope.node), current, decided, watched):
            assert current is not None
            undecided.append((index, current.remediation.max_per_hour))
        if isinstance(payload, MigReconfigurationStarted) and current is not None:
            # the runtime carried out the first decision as it recorded the start
            saga_ = mig_folding.started(envelope.node, payload, envelope.time)
            first = mig_kind.begin(saga_, current, envelope.time)
            reconfigurations[envelope.node] = first.saga
            result.nodes.add(envelope.node)
            result.events += 1
            result.outputs.setdefault(envelope.node, []).extend(
                Output(_kind(out), out.id, out.payload.TYPE, _dump(out.payload))
                for out in mig_folding.outputs(first)
            )
            continue
        if not isinstance(payload, Event) or current is None:
            continue
        saga = sagas.get(envelope.node)
        folded = False
        if (
            saga is not None
            and folding.is_inbound(payload)
            and folding.trigger(saga, payload) is not None
        ):
            folded = True
            decision = folding.step(saga, payload, current, envelope.time)
            if decision is not None:
                sagas[envelope.node] = decision.saga
                result.outputs.setdefault(envelope.node, []).extend(
                    Output(_kind(out), out.id, out.payload.TYPE, _dump(out.payload))
                    for out in folding.outputs(decision)
                )
        remedied = remediations.get(envelope.node)
        if remedied is not None and remediation.is_inbound(payload):
            remedy = remediation.step(remedied, payload, current, envelope.time)
            if remedy is not None:
                folded = True
                remediations[envelope.node] = remedy.saga
                result.outputs.setdefault(envelope.node, []).extend(
                    Output(_kind(out), out.id, out.payload.TYPE, _dump(out.payload))
                    for out in remediation.outputs(remedy)
                )
        carving = reconfigurations.get(envelope.node)
        if carving is not None and mig_folding.is_inbound(payload):
            folded = folded or mig_folding.trigger(carving, payload) is not None
            carved = mig_folding.step(carving, payload, current, envelope.time)
            if carved is not None:
                reconfigurations[envelope.node] = carved.saga
                result.outputs.setdefault(envelope.node, []).extend(
                    Output(_kind(out), out.id, out.payload.TYPE, _dump(out.payload))
                    for out in mig_folding.outputs(carved)
                )
        result.events += folded
    result.unrecorded = _missing_refusals(events, undecided)
    return result


def _undecided(
    entry: Recorded,
    running: RemediationSaga | None,
    policy: GPUClusterPolicySpec | None,
    decided: set[str],
    watched: Watched,
) -> bool:
    """Whether `entry` is a health event the runtime's starter would have put to the
    breaker, and the log records no start or refusal for."""
    if not isinstance(entry.payload, DeviceHealthChanged) or entry.envelope.id in decided:
        return False
    if not watched.knows(entry.envelope.node):
        return False  # about no GPU node the watch knew: the starter puts it to no breaker
    if policy is None or not policy.remediation.enabled:
        return False
    if not remediation.calls_for_remediation(entry.payload):
        return False
    return running is None or running.state in TERMINAL_STATES


def _missing_refusals(
    events: Sequence[Recorded], undecided: Sequence[tuple[int, int]]
) -> list[str]:
    """The undecided health events (index in `events`, limit) the breaker refuses.

    The starter decides in stream order, after the event is stored, so a start decided
    before an event is one recorded, or caused by an event stored, before it; and the
    starter's clock then was no earlier than those starts. A node whose start was decided
    before the event but recorded after it had a remediation running: not put to the
    breaker."""
    where = {r.envelope.id: i for i, r in enumerate(events)}
    starts = [
        (min(i, where.get(r.envelope.causationid or "", i)), i, r)
        for i, r in enumerate(events)
        if isinstance(r.payload, RemediationStarted)
    ]
    missing = []
    for index, limit in undecided:
        entry = events[index]
        node = entry.envelope.node
        if any(d < index < i and r.envelope.node == node for d, i, r in starts):
            continue
        before = [r.envelope.time for d, _, r in starts if d < index]
        now = max([entry.envelope.time, *before])
        if not breaker.allows(before, now, limit):
            missing.append(
                f"line {entry.line}: {node}'s health event {entry.envelope.id} called for a "
                "remediation the circuit breaker refuses, and the log records no refusal"
            )
    return missing


def _started(
    envelope: Envelope, started: SagaStarted, policy: GPUClusterPolicySpec, line: int
) -> NodeSaga:
    try:
        return folding.started_saga(envelope.node, started, policy, envelope.time)
    except ValueError as exc:  # ValidationError is one
        raise ReplayInputError(f"line {line}: cannot start the saga: {exc}") from None


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
