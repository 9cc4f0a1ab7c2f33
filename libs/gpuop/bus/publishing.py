"""What every publish carries, computed once for both bus implementations.

The subject comes from the payload type and node, the event id becomes `Nats-Msg-Id` (so a
retried publish is dropped by the server), and the current trace context is written into
the envelope and the `traceparent` header so consumers continue the producer's trace.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuop.bus import streams
from gpuop.events import Envelope, bus_subject, subjects
from gpuop.observability import tracing


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A message ready for the wire."""

    subject: str
    data: bytes
    headers: dict[str, str]
    kind: subjects.Kind


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
    prefix: str, *, subject: str, data: bytes, consumer: str, seq: int, kind: str, reason: str
) -> Outgoing:
    """The dead letter of a message: the original bytes, and why, in headers.

    Its id is derived from the consumer and the original sequence, so storing the same dead
    letter twice (a crash between store and terminate) keeps one copy.
    """
    headers = {
        streams.MSG_ID: f"dlq:{consumer}:{seq}",
        streams.DLQ_REASON: _header_safe(reason),
        streams.DLQ_KIND: kind,
        streams.DLQ_SUBJECT: subject,
        streams.DLQ_CONSUMER: consumer,
        streams.DLQ_SEQ: str(seq),
    }
    return Outgoing(
        subjects.dead_letter_subject(subject, prefix=prefix),
        data,
        headers,
        subjects.Kind.DEAD_LETTER,
    )


def _header_safe(text: str) -> str:
    """Headers are single lines of text."""
    return " ".join(text.split())[:1024] or "-"
