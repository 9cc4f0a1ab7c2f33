"""Names and retention of the streams and buckets, derived from the subject prefix, and the
names of the node agents' durable consumers.

Several clusters can share one NATS when each uses its own prefix; every stream and bucket
name carries it (`GPUOP_EVENTS`, `gpuop_sagas` for the default prefix).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuop.bus.protocol import Buckets
from gpuop.events import subjects

DAY = 86400.0
DEFAULT_EVENTS_MAX_AGE = 30 * DAY
DUPLICATE_WINDOW = 120.0
"""Seconds within which a repeated event id is dropped; publish retries stay inside it."""
MAX_DURABLE_TOKEN = 64
"""Longest node token a durable consumer name carries as it is."""


@dataclass(frozen=True, slots=True)
class StreamLayout:
    """One stream: its name, what it captures, how long it keeps it."""

    name: str
    kind: subjects.Kind
    subjects: tuple[str, ...]
    max_age: float
    """Seconds; 0 keeps messages until the limits of the server."""


@functools.cache
def layouts(
    prefix: str, *, events_max_age: float = DEFAULT_EVENTS_MAX_AGE
) -> tuple[StreamLayout, ...]:
    """The three streams for `prefix` (computed once: every publish routes through it)."""
    subjects.validate_prefix(prefix)
    stem = prefix.upper().replace("-", "_")
    return (
        StreamLayout(
            f"{stem}_EVENTS",
            subjects.Kind.EVENT,
            (subjects.stream_filter(subjects.Kind.EVENT, prefix=prefix),),
            events_max_age,
        ),
        StreamLayout(
            f"{stem}_COMMANDS",
            subjects.Kind.COMMAND,
            (subjects.stream_filter(subjects.Kind.COMMAND, prefix=prefix),),
            events_max_age,
        ),
        StreamLayout(
            f"{stem}_DLQ",
            subjects.Kind.DEAD_LETTER,
            (subjects.stream_filter(subjects.Kind.DEAD_LETTER, prefix=prefix),),
            events_max_age,
        ),
    )


DRIFT_UPDATABLE = frozenset({"subjects", "max_age", "duplicate_window", "num_replicas"})
"""Stream settings JetStream changes in place; a drift elsewhere (storage) stops the start."""


def drift(have: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The settings of an existing stream (`have`, the server's config as a dict) that
    differ from what gpuop creates (`want`): name -> (have, want). Durations compare in
    seconds, subjects as sets."""

    def norm(key: str, value: Any) -> Any:
        if key == "subjects":
            return sorted(value or ())
        if key in ("max_age", "duplicate_window") and value is not None:
            return round(float(value), 3)
        if key == "num_replicas":
            return int(value or 1)
        return value

    return {
        key: (have.get(key), value)
        for key, value in want.items()
        if norm(key, have.get(key)) != norm(key, value)
    }


def stream_for(prefix: str, subject_filter: str) -> StreamLayout:
    """The stream that holds `subject_filter` (a subject or a wildcard of one kind)."""
    parts = subject_filter.split(".")
    for layout in layouts(prefix):
        if len(parts) >= 2 and parts[0] == prefix and parts[1] == layout.kind:
            return layout
    raise ValueError(
        f"subject {subject_filter!r} belongs to no gpuop stream: "
        f"expected {prefix}.evt.…, {prefix}.cmd.… or {prefix}.dlq.…"
    )


def bucket_name(prefix: str, bucket: Buckets | str) -> str:
    """`gpuop_sagas` for bucket `sagas`."""
    return f"{prefix.replace('-', '_')}_{bucket}"


def node_durable(service: str, node: str, purpose: str) -> str:
    """The durable consumer name of `service`'s agent on `node` for `purpose`
    (`discovery-gpu-1-commands`); stable across restarts, so the agent resumes after its
    last acked message."""
    # durable names become file names on the server: keep long node names short
    token = subjects.encode_node(node)
    if len(token) > MAX_DURABLE_TOKEN:
        token = token[:40] + "-" + hashlib.sha256(token.encode()).hexdigest()[:16]
    return f"{service}-{token}-{purpose}"


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: `*` is one token, a final `>` is one or more tokens."""
    want = pattern.split(".")
    have = subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


DLQ_REASON = "Gpuop-Dlq-Reason"
DLQ_KIND = "Gpuop-Dlq-Kind"
DLQ_SUBJECT = "Gpuop-Original-Subject"
DLQ_CONSUMER = "Gpuop-Consumer"
DLQ_SEQ = "Gpuop-Original-Seq"
DLQ_TRUNCATED = "Gpuop-Dlq-Truncated"
"""On a dead letter whose original did not fit beside the headers: the original's length."""
MSG_ID = "Nats-Msg-Id"
TRACEPARENT = "traceparent"
