"""What every publish carries, computed once for both bus implementations.

The subject comes from the payload type and node, the event id becomes `Nats-Msg-Id` (so a
retried publish is dropped by the server; keyed by the publisher's credential, `message_id`),
and the current trace context is written into
the envelope and the `traceparent` header so consumers continue the producer's trace. A first
try answered as a duplicate is not a success (`checked`): someone else stored our id.

Nothing goes out larger than the server accepts (`fitting`): nats-server closes the
connection of a client that sends a message over its `max_payload` (data and headers
together) or a protocol line over its `max_control_line` (a very long subject), and every
consumer and publish of the service would go down with it. A hostile message can be stored
at either limit, so its dead letter keeps as much of the original as fits beside its
headers, under a subject shortened to `MAX_SUBJECT`.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from gpuop.bus import streams
from gpuop.bus.errors import IdTaken, MessageTooLarge
from gpuop.bus.protocol import PublishAck
from gpuop.events import Envelope, bus_subject, subjects
from gpuop.observability import tracing
from gpuop.observability.metrics import BusMetrics

log = logging.getLogger(__name__)

DEFAULT_MAX_PAYLOAD = 1024 * 1024
"""nats-server's default `max_payload`; the server announces its own when a client connects."""
MAX_SUBJECT = 1024
"""Longest subject sent, in bytes: far below nats-server's default `max_control_line` (4 KiB),
which must also hold a reply inbox and the sizes."""
MAX_TOKEN = 128
"""Longest token of a shortened dead-letter subject; gpuop's own are shorter (a node token
may have 253 characters, but no subject of gpuop's is shortened)."""
_HEADER_LINE = len(b"NATS/1.0\r\n")


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A message ready for the wire."""

    subject: str
    data: bytes
    headers: dict[str, str]
    kind: subjects.Kind


def size_on_wire(data: bytes, headers: dict[str, str]) -> int:
    """Bytes the server counts against `max_payload`: the data and the encoded headers."""
    if not headers:
        return len(data)
    fields = sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())
    return len(data) + _HEADER_LINE + fields + 2


def fitting(out: Outgoing, max_payload: int) -> Outgoing:
    """`out`, or `MessageTooLarge` when the server would refuse it: over `max_payload`, or
    an event over what the event log stores (`streams.EVENT_BYTES`)."""
    if len(out.subject.encode()) > MAX_SUBJECT:
        raise MessageTooLarge(f"{out.subject[:200]}...: a subject over {MAX_SUBJECT} bytes")
    size = size_on_wire(out.data, out.headers)
    if size > max_payload:
        raise MessageTooLarge(
            f"{out.subject[:200]}: {size} bytes with headers, the server accepts {max_payload}"
        )
    if out.kind == subjects.Kind.EVENT and size > streams.EVENT_BYTES:
        raise MessageTooLarge(
            f"{out.subject[:200]}: {size} bytes with headers, the event log stores "
            f"{streams.EVENT_BYTES}"
        )
    return out


def id_key(servers: list[str], creds: bytes | None = None) -> bytes:
    """The key a publisher's message ids are made with: from its credential (the password in
    its NATS URL, or its credentials file), so every process of one NATS user (a service's
    agents on every node, both orchestrator replicas) makes the same ids and no other user
    can; empty without a credential (no auth: nothing to squat against)."""
    secrets = [creds] if creds else []
    for server in servers:
        parts = urlsplit(server)
        if parts.password:
            secrets.append(f"{unquote(parts.username or '')}:{unquote(parts.password)}".encode())
            break
    if not secrets:
        return b""
    return hashlib.sha256(b"gpuop message ids\0" + b"\0".join(secrets)).digest()


def message_id(key: bytes, subject: str, id: str) -> str:
    """The `Nats-Msg-Id` of message `id` on `subject`. JetStream drops a repeated id whatever
    its subject or publisher, and gpuop's ids follow from public facts (`gpuop.events.ids`):
    taken as they are, any user could store a driver result's id first, on a subject of its
    own, and the real result would be dropped as a duplicate. Keyed by the publisher's
    credential the id is the same for every try of that publisher and unknown to the others.
    Without a key it is the envelope id."""
    if not key:
        return id
    return hmac.new(key, f"{subject}:{id}".encode(), hashlib.sha256).hexdigest()[:40]


def checked(ack: PublishAck, out: Outgoing, *, first_try: bool, metrics: BusMetrics) -> PublishAck:
    """`ack`, unless it answers the first try of a publish as a duplicate: then the server
    held our id before we sent anything, so someone else stored it (a squat, or a publisher
    that shares our credential and forged our subject's id), and our message was dropped.
    Logged as an error, counted (`gpuop_bus_ids_taken_total`) and raised as `IdTaken`. A
    duplicate answering a retry (an earlier try that timed out) or a deliberate re-publish
    (`republish=True`: a new leader re-issuing a step, an agent replaying a recorded
    answer) is the earlier copy, and a success."""
    if not (ack.duplicate and first_try):
        return ack
    msg_id = out.headers.get(streams.MSG_ID, "")
    log.error(
        "publish to %s dropped as a duplicate on its first try: id %s was stored first by "
        "another publisher (sequence %d in %s)",
        out.subject,
        msg_id,
        ack.seq,
        ack.stream,
    )
    metrics.id_taken(out.kind)
    raise IdTaken(out.subject, msg_id, ack.seq)


def prepare(envelope: Envelope, prefix: str, key: bytes = b"") -> Outgoing:
    """Subject, bytes and headers for `envelope`; its message id made with `key`."""
    if envelope.traceparent is None:
        current = tracing.current_traceparent()
        if current is not None:
            envelope = envelope.model_copy(update={"traceparent": current})
    subject = bus_subject(envelope, prefix=prefix)
    headers = {streams.MSG_ID: message_id(key, subject, envelope.id)}
    if envelope.traceparent:
        headers[streams.TRACEPARENT] = envelope.traceparent
    kind = subjects.Kind(subject.split(".")[1])
    return Outgoing(subject, envelope.to_bytes(), headers, kind)


def raw(prefix: str, subject: str, data: bytes, headers: dict[str, str] | None) -> Outgoing:
    """Bytes for `subject` as they are; the subject must belong to one of the streams."""
    kind = subjects.Kind(streams.stream_for(prefix, subject).kind)
    return Outgoing(subject, data, dict(headers or {}), kind)


def dead_letter(
    prefix: str,
    *,
    subject: str,
    data: bytes,
    consumer: str,
    seq: int,
    kind: str,
    reason: str,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
    key: bytes = b"",
) -> Outgoing:
    """The dead letter of a message: the original bytes, and why, in headers.

    Its id is derived from the consumer and the original sequence, so storing the same dead
    letter twice (a crash between store and terminate) keeps one copy, and keyed with `key`
    like every message id (`message_id`), so that no other user can take it first and have
    the dead letter dropped. An original too large
    to fit beside the headers in `max_payload` is cut to fit, and `DLQ_TRUNCATED` gives its
    length (the whole message stays in its own stream, at `DLQ_SEQ`). An original subject too
    long for `MAX_SUBJECT` is shortened in the dead letter's subject (`DLQ_SUBJECT` has it
    whole).
    """
    headers = {
        streams.MSG_ID: message_id(key, "dlq", f"dlq:{consumer}:{seq}"),
        streams.DLQ_REASON: _header_safe(reason),
        streams.DLQ_KIND: kind,
        streams.DLQ_SUBJECT: subject,
        streams.DLQ_CONSUMER: consumer,
        streams.DLQ_SEQ: str(seq),
    }
    if size_on_wire(data, headers) > max_payload:
        headers[streams.DLQ_TRUNCATED] = str(len(data))
        data = data[: max(0, max_payload - size_on_wire(b"", headers))]
    return Outgoing(
        _dead_letter_subject(subject, prefix),
        data,
        headers,
        subjects.Kind.DEAD_LETTER,
    )


def _dead_letter_subject(original: str, prefix: str) -> str:
    """`<prefix>.dlq.<original>`, shortened to `MAX_SUBJECT` if need be: each token of the
    original cut to `MAX_TOKEN` (so that the subject keeps its tokens, which the per-service
    permissions of deploy/nats match one by one), then, for a subject of many tokens, the
    end cut off."""
    where = subjects.dead_letter_subject(original, prefix=prefix)
    if len(where.encode()) <= MAX_SUBJECT:
        return where
    shortened = ".".join(_cut(token, MAX_TOKEN) for token in original.split("."))
    return _cut(subjects.dead_letter_subject(shortened, prefix=prefix), MAX_SUBJECT).rstrip(".")


def _cut(text: str, size: int) -> str:
    """The longest start of `text` of at most `size` bytes."""
    return text.encode()[:size].decode(errors="ignore")


def _header_safe(text: str) -> str:
    """Headers are single lines of text."""
    return " ".join(text.split())[:1024] or "-"
