"""What every publish carries, computed once for both bus implementations.

The subject comes from the payload type and node, the event id becomes `Nats-Msg-Id` (so a
retried publish is dropped by the server), and the current trace context is written into
the envelope and the `traceparent` header so consumers continue the producer's trace.

Nothing goes out larger than the server accepts (`fitting`): nats-server closes the
connection of a client that sends a message over its `max_payload`, data and headers
together, and every consumer and publish of the service would go down with it. A dead
letter keeps as much of the original as fits beside its headers.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuop.bus import streams
from gpuop.bus.errors import MessageTooLarge
from gpuop.events import Envelope, bus_subject, subjects
from gpuop.observability import tracing

DEFAULT_MAX_PAYLOAD = 1024 * 1024
"""nats-server's default `max_payload`; the server announces its own when a client connects."""
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
    """`out`, or `MessageTooLarge` when the server would refuse it."""
    size = size_on_wire(out.data, out.headers)
    if size > max_payload:
        raise MessageTooLarge(
            f"{out.subject[:200]}: {size} bytes with headers, the server accepts {max_payload}"
        )
    return out


def prepare(envelope: Envelope, prefix: str) -> Outgoing:
    """Subject, bytes and headers for `envelope`."""
    if envelope.traceparent is None:
        current = tracing.current_traceparent()
        if current is not None:
            envelope = envelope.model_copy(update={"traceparent": current})
    subject = bus_subject(envelope, prefix=prefix)
    headers = {streams.MSG_ID: envelope.id}
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
) -> Outgoing:
    """The dead letter of a message: the original bytes, and why, in headers.

    Its id is derived from the consumer and the original sequence, so storing the same dead
    letter twice (a crash between store and terminate) keeps one copy. An original too large
    to fit beside the headers in `max_payload` is cut to fit, and `DLQ_TRUNCATED` gives its
    length (the whole message stays in its own stream, at `DLQ_SEQ`).
    """
    headers = {
        streams.MSG_ID: f"dlq:{consumer}:{seq}",
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
        subjects.dead_letter_subject(subject, prefix=prefix),
        data,
        headers,
        subjects.Kind.DEAD_LETTER,
    )


def _header_safe(text: str) -> str:
    """Headers are single lines of text."""
    return " ".join(text.split())[:1024] or "-"
