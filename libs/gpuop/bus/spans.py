"""The span a service opens around handling one command: `handle <verb>`.

The dispatcher has already made the command's `traceparent` the current trace parent
(`tracing.attached`), so the span continues the trace of whoever sent the command (for an
upgrade, the orchestrator's saga step). Whatever the handler publishes inside it carries
this span as its parent (`publishing.prepare`), so the sender's handling of the answer
joins the same trace. With tracing off the span is a no-op that passes the command's own
trace context through.

Node agents call it first thing in their command handlers:

    async def on_command(self, delivery: Delivery) -> None:
        with spans.handling(__name__, delivery):
            ...
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace

from gpuop.bus.protocol import Delivery
from gpuop.events import Command
from gpuop.observability import tracing


@contextmanager
def handling(scope: str, delivery: Delivery) -> Iterator[trace.Span]:
    """A consumer span around the handling of `delivery`; `scope` is the caller's `__name__`.

    An exception leaving the block is recorded on the span, which ends as an error.
    """
    envelope, payload = delivery.envelope, delivery.payload
    verb = payload.VERB if isinstance(payload, Command) else envelope.type
    attributes: dict[str, str | int] = {
        "messaging.system": "nats",
        "messaging.operation.type": "process",
        "messaging.destination.name": delivery.subject,
        "messaging.message.id": envelope.id,
        "gpuop.message.type": envelope.type,
        "gpuop.delivery.attempt": delivery.attempt,
        "k8s.node.name": envelope.node,
    }
    if envelope.correlationid:
        attributes["messaging.message.conversation_id"] = envelope.correlationid
    with tracing.tracer(scope).start_as_current_span(
        f"handle {verb}", kind=trace.SpanKind.CONSUMER, attributes=attributes
    ) as span:
        yield span
