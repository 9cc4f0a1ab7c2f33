"""The bus seam: what services may ask of the bus, whatever implements it.

`NatsBus` (JetStream) and `InMemoryBus` (unit tests) both satisfy `Bus`;
one contract suite runs against both. Services receive a `Bus` in their constructor.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from gpuop.events import Envelope, Payload


class Buckets(enum.StrEnum):
    """KV buckets, named `<prefix>_<name>`."""

    SAGAS = "sagas"
    """One key per node saga, written by the orchestrator with compare-and-set."""
    NODES = "nodes"
    """Latest hardware inventory per node."""
    CONFIG = "config"
    """The effective policy, watched by node agents."""
    IPAM = "ipam"
    """Address claims, created if absent so no two nodes hold one address."""


class UnknownErrors(enum.StrEnum):
    """What to do when a handler raises an exception outside the `HandlerError` tree."""

    RETRY = "retry"
    DEAD_LETTER = "dead-letter"


@dataclass(frozen=True, slots=True)
class PublishAck:
    """The server's receipt for a publish."""

    stream: str
    seq: int
    duplicate: bool
    """True when the event id was already stored: the publish was a retry, or a deliberate
    re-publish, and was dropped (a first publish answered so raises `IdTaken` instead)."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One decoded message handed to a handler."""

    subject: str
    envelope: Envelope
    payload: Payload
    attempt: int
    """1 on first delivery, then counts redeliveries."""
    stream_seq: int


Handler = Callable[[Delivery], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    """A durable pull consumer: which subjects, and how hard to try."""

    durable: str
    """Name that survives restarts: the consumer resumes after the last acked message."""
    subjects: Sequence[str]
    """Filters, all events or all commands (one stream per consumer)."""
    max_deliver: int = 5
    """Deliveries before a message that keeps failing is dead-lettered."""
    ack_wait: float = 30.0
    """Seconds before an unacknowledged delivery is sent again."""
    max_in_flight: int = 256
    """Messages held at once, across all nodes."""
    max_in_flight_per_node: int | None = None
    """Of those, the most one node's messages may hold, its further ones waiting without a
    slot (see `gpuop.bus.dispatching`), so that one node's flood never holds them all; None:
    no share, a node's messages may take every slot."""
    on_unknown_error: UnknownErrors = UnknownErrors.RETRY
    """Outcome for exceptions that are neither temporary nor permanent."""
    retry_delay: float = 1.0
    """Delay for retried unknown errors."""
    deliver_new_only: bool = False
    """Start at new messages instead of the beginning of the stream (first creation only)."""
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message as stored in a stream, for `read` (tail, replay, audit)."""

    stream: str
    seq: int
    subject: str
    data: bytes
    time: datetime
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class KvEntry:
    """One revision of one key."""

    key: str
    value: bytes
    revision: int
    deleted: bool = False


class Subscription(Protocol):
    """A running consumer."""

    @property
    def durable(self) -> str: ...

    async def stop(self) -> None:
        """Stop fetching; messages in hand finish, unacked ones are redelivered later."""


class KeyValue(Protocol):
    """A KV bucket with revisions; every dependent write uses compare-and-set."""

    @property
    def bucket(self) -> str: ...

    async def get(self, key: str) -> KvEntry | None:
        """The latest live entry, or None if absent or deleted."""

    async def put(self, key: str, value: bytes) -> int:
        """Unconditional write; returns the new revision."""

    async def create(self, key: str, value: bytes) -> int:
        """Write only if absent (or deleted); raises `KeyExists`."""

    async def update(self, key: str, value: bytes, revision: int) -> int:
        """Write only if `revision` is still the latest; raises `RevisionConflict`."""

    async def delete(self, key: str, revision: int | None = None) -> None:
        """Delete (with an optional expected revision)."""

    async def keys(self) -> list[str]:
        """Live keys, sorted."""

    def watch(self, pattern: str = ">") -> AsyncIterator[KvEntry | None]:
        """Current entries, then `None` once caught up, then live changes."""


class Bus(Protocol):
    """Publish events and commands, consume them durably, and keep KV state."""

    @property
    def prefix(self) -> str: ...
    @property
    def max_payload(self) -> int:
        """Largest message, data and headers together, the bus accepts; a larger one is
        refused with `MessageTooLarge`."""

    async def start(self) -> None:
        """Connect and create streams and buckets (idempotent)."""

    async def close(self) -> None:
        """Stop every consumer and disconnect."""

    async def publish(self, envelope: Envelope, *, republish: bool = False) -> PublishAck:
        """Publish one message and wait for the server's receipt. Its id already stored
        raises `IdTaken` (someone else's message under our id), unless the id was stored by
        an earlier try of this call, or `republish` says this message may have been
        published before (a new leader re-issuing a step, an answer replayed): then the
        receipt says `duplicate`."""

    async def publish_batch(
        self, envelopes: Sequence[Envelope], *, republish: bool = False
    ) -> list[PublishAck]:
        """Publish many messages pipelined; receipts in the same order."""

    async def publish_raw(
        self,
        subject: str,
        data: bytes,
        headers: dict[str, str] | None = None,
        *,
        republish: bool = False,
    ) -> PublishAck:
        """Publish bytes as they are (replaying dead letters, hostile-input tests)."""

    async def consume(self, spec: ConsumerSpec, handler: Handler) -> Subscription:
        """Start a durable consumer; one node's messages are handled in order."""

    async def kv(self, bucket: Buckets | str) -> KeyValue:
        """A KV bucket created by `start()`."""

    async def last(self, subject: str) -> StoredMessage | None:
        """The latest stored message on exactly `subject` (no wildcards), or None."""

    def read(
        self, subject: str, *, since: datetime | None = None, follow: bool = False
    ) -> AsyncIterator[StoredMessage]:
        """Stored messages matching `subject` in stream order, from `since` or the start."""
