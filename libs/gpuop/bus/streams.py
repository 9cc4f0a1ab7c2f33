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


MiB = 1 << 20
GiB = 1 << 30
DEFAULT_STORE_BYTES = 6 * GiB
"""What gpuop's streams and buckets reserve of the account's file store together. The shipped
account holds 10 GiB (deploy/nats/accounts.conf). The budget plus the event log's share must
fit it: a create of an existing stream, which every service's start sends, counts that
stream's limit a second time (a single nats-server 2.15 refused the second start at 8 GiB),
so 6 GiB reserves at most 8.4 GiB, and the rest is room for an administrator's copy of a
bucket during a repair."""
DEFAULT_EVENTS_PER_SUBJECT = 240
"""Messages the event log keeps per subject: two hours of a node's heartbeats (one every
30 s, about 0.6 KB: 0.7 GB at 5,000 nodes). Every other event subject is one node's one
event name, which a node sees a few times per rollout, so only heartbeats reach it."""
EVENT_BYTES = 128 * 1024
"""The largest message the event log stores (its `max_msg_size`). gpuop's largest event, a
node's inventory, is a few KB to a few tens of KB; a node's flood of messages as large as
the account takes (1 MB) on each of its exact names would otherwise hold `events_per_subject`
of them per name: 4.5 GB for the driver domain's 19 names alone, more than the log's share
of the store, whose byte limit then drops the oldest messages, the audit trail first. At
this bound all five agents of one node (33 names) keep at most 1 GiB, within the default
share (2.4 GiB), and a batch of 64 events fetched by a consumer is at most 8 MiB, far below
the server's per-client write buffer (64 MiB), past which the server cuts the client off
as a slow consumer: the orchestrator, fetching a node's 1 MB messages, was cut off again
and again and decided nothing."""
SHARES: Mapping[str, float] = {
    subjects.Kind.EVENT: 0.40,
    subjects.Kind.COMMAND: 0.10,
    subjects.Kind.DEAD_LETTER: 0.10,
    Buckets.SAGAS: 0.10,
    Buckets.NODES: 0.20,
    Buckets.CONFIG: 0.05,
    Buckets.IPAM: 0.05,
}
"""Each stream's and bucket's part of the store (the inventories are the largest values)."""
KiB = 1 << 10
VALUE_BYTES: Mapping[str, int] = {Buckets.IPAM: 4 * KiB}
"""The largest message a bucket's stream takes (its `max_msg_size`: key, value and headers),
where it is far below the account's 1 MB payload. Every IPAM value is a small JSON object (a
claim or a record: node, network and address; a block: node, first and last address), under
1 KB with the longest names Kubernetes allows; without the bound one node's network-manager
could fill the whole bucket with a few hundred 1 MB values under its own keys, and every
other node's next claim would be refused (a full bucket takes no new writes). The bound is
the stream's, so it holds for every user alike: nats-server gives a user no payload limit of
its own, neither a static one (it refuses `max_payload` in a user) nor one the auth callout
issues (it applies only the issued JWT's permissions: server/auth_callout.go)."""


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """What each stream and bucket may hold. JetStream reserves a stream's byte limit
    against the account's file store when the stream is created, times its replicas, and
    refuses a stream that does not fit: so the limits are one budget, `store_bytes`, shared
    out by `SHARES`, and a stream's byte limit is its share divided by its replicas. A
    flood on one stream then fills that stream (its oldest messages go), never another's
    room nor the account."""

    store_bytes: int = DEFAULT_STORE_BYTES
    """Bytes of the account's file store gpuop's streams and buckets reserve, all replicas
    together."""
    events_per_subject: int = DEFAULT_EVENTS_PER_SUBJECT
    """Messages the event log keeps per subject (`DEFAULT_EVENTS_PER_SUBJECT`)."""

    def __post_init__(self) -> None:
        if self.store_bytes < MiB:
            raise ValueError(f"store_bytes must be at least 1 MiB, not {self.store_bytes}")
        if self.events_per_subject < 1:
            raise ValueError(f"events_per_subject must be 1 or more, not {self.events_per_subject}")

    def share(self, part: str) -> int:
        """Bytes stream kind or bucket `part` may reserve, all its replicas together."""
        return int(self.store_bytes * SHARES[part])


DEFAULT_LIMITS = StoreLimits()


def replica_bytes(share: int, replicas: int) -> int:
    """The byte limit of a stream holding `share` bytes of the store over `replicas`
    copies: JetStream reserves the limit once per replica."""
    return max(1, share // max(1, replicas))


@dataclass(frozen=True, slots=True)
class StreamLayout:
    """One stream: its name, what it captures, how long and how much it keeps."""

    name: str
    kind: subjects.Kind
    subjects: tuple[str, ...]
    max_age: float
    """Seconds; 0 keeps messages until the limits of the server."""
    share: int
    """Bytes of the store it may reserve, all replicas together (`replica_bytes`)."""
    max_msgs_per_subject: int = -1
    """Messages kept per subject, the oldest dropped first; -1: no limit."""
    max_msg_size: int = -1
    """The largest message stored (a larger one is refused); -1: the server's limit."""


@functools.cache
def layouts(
    prefix: str,
    *,
    events_max_age: float = DEFAULT_EVENTS_MAX_AGE,
    limits: StoreLimits = DEFAULT_LIMITS,
) -> tuple[StreamLayout, ...]:
    """The three streams for `prefix` (computed once: every publish routes through it).

    Each drops its oldest messages when full (JetStream's default): the event log is read
    as a history, a command stream keeps commands long consumed, and a full stream that
    refused new messages would stop every saga. Heartbeats, the one subject that repeats
    without end, are bounded per subject on the event log, so they never push the audit
    trail out (the other event subjects stay far below the bound); a stream of their own
    would need the event log's subjects to name every other event, since JetStream refuses
    two streams whose subjects overlap."""
    subjects.validate_prefix(prefix)
    stem = prefix.upper().replace("-", "_")

    def layout(
        name: str, kind: subjects.Kind, per_subject: int = -1, size: int = -1
    ) -> StreamLayout:
        return StreamLayout(
            f"{stem}_{name}",
            kind,
            (subjects.stream_filter(kind, prefix=prefix),),
            events_max_age,
            limits.share(kind),
            per_subject,
            size,
        )

    return (
        layout("EVENTS", subjects.Kind.EVENT, limits.events_per_subject, EVENT_BYTES),
        layout("COMMANDS", subjects.Kind.COMMAND),
        layout("DLQ", subjects.Kind.DEAD_LETTER),
    )


DRIFT_COMPARED = (
    "subjects",
    "storage",
    "max_age",
    "duplicate_window",
    "num_replicas",
    "max_bytes",
    "max_msgs_per_subject",
    "max_msg_size",
    "discard",
    "allow_direct",
)
"""The stream settings a start compares with what gpuop creates, in the order a drift is
reported."""
DRIFT_UPDATABLE = frozenset(DRIFT_COMPARED) - {"storage"}
"""Stream settings JetStream changes in place; a drift elsewhere (storage) stops the start.
A server's streams made before the byte limits get them this way, and before direct gets
(`Bus.last`) their allow_direct."""


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
        if key in ("max_bytes", "max_msgs_per_subject", "max_msg_size"):
            return -1 if value is None or int(value) <= 0 else int(value)
        if key == "discard":
            return str(getattr(value, "value", value) or "old")
        if key == "allow_direct":
            return bool(value)
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
