"""OpenTelemetry setup for one gpuop process, and trace propagation through the envelope.

Every service calls `configure_tracing` once at start, before it opens the bus. Producers
stamp `current_traceparent()` into the envelope's `traceparent` extension; the bus consumer
wraps each handler call in `attached(envelope.traceparent)`, so the spans a handler opens
continue the producer's trace across processes and nodes. The logging setup reads the
current span to put `trace_id` and `span_id` on every log line.

The standard `OTEL_*` variables are honoured:

- `OTEL_SDK_DISABLED=true` installs nothing: spans are no-ops and carry no ids.
- `OTEL_TRACES_EXPORTER` is a comma-separated list of `otlp`, `console` and `none`. When it is
  unset, spans are exported over OTLP only if an OTLP endpoint is configured
  (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`), and otherwise
  not at all; ids are still generated and propagated, so logs stay correlated.
- The OTLP exporter (`opentelemetry-exporter-otlp-proto-http`) is an optional package,
  imported only when asked for; without it the process runs on with one warning.
- `OTEL_TRACES_SAMPLER`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES` and the exporter's
  own variables are read by the SDK.

Work that outlives a process (an upgrade saga, continued by whichever replica leads) is traced
under ids derived from its durable identity (`derived_trace_id`, `derived_span_id`): any
process can parent a span on one of them (`context_of`) before that span exists, and
`record_span` records it later, with those ids and its real start, once it has ended.
"""

from __future__ import annotations

import contextvars
import hashlib
import importlib
import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

_log = logging.getLogger(__name__)

OTLP_EXPORTER_MODULE = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
"""Where the optional OTLP/HTTP span exporter lives; imported only when configured."""

_OTLP_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_TRACEPARENT = "traceparent"
# Only the W3C traceparent travels in the envelope; baggage and tracestate are not carried.
_PROPAGATOR = TraceContextTextMapPropagator()

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_configure_lock = threading.Lock()
_configured = False
_pinned: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "gpuop_pinned_span_ids", default=None
)
"""(trace id, span id) for the one span `record_span` is opening, else None."""


def configure_tracing(service: str, *, node: str | None = None) -> None:
    """Install the process-wide tracer provider for `gpuop-<service>`; later calls do nothing.

    OpenTelemetry allows one global provider per process, so the first call wins.
    """
    global _configured
    with _configure_lock:
        if _configured:
            _log.debug("tracing already configured; ignoring configure_tracing(%r)", service)
            return
        _configured = True
        provider = build_tracer_provider(service, node=node)
        if provider is None:
            _log.info("tracing disabled by OTEL_SDK_DISABLED")
            return
        trace.set_tracer_provider(provider)


def build_tracer_provider(
    service: str,
    *,
    node: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> TracerProvider | None:
    """Build (without installing) the provider `configure_tracing` would install.

    Returns None when `OTEL_SDK_DISABLED` is true.
    """
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    provider = TracerProvider(resource=_resource(service, node, env), id_generator=PinnableIds())
    for name in _exporter_names(env):
        if name == "console":
            # Bound now, not at import time, so a redirected stdout is honoured.
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stdout)))
        elif name == "otlp":
            exporter = _otlp_exporter()
            if exporter is not None:
                provider.add_span_processor(BatchSpanProcessor(exporter))
        else:
            _log.warning(
                "ignoring OTEL_TRACES_EXPORTER value %r (supported: otlp, console, none)",
                name,
            )
    return provider


def tracer(name: str) -> trace.Tracer:
    """The tracer for one instrumented module; pass `__name__`."""
    return trace.get_tracer(name)


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span, or None outside a valid (sampled or not) span."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get(_TRACEPARENT)


def context_from(traceparent: str | None) -> otel_context.Context:
    """The context whose parent span is `traceparent`.

    A missing or malformed traceparent yields an empty context, so a handler starts a fresh
    trace instead of failing on a producer's bad header.
    """
    if not traceparent:
        return otel_context.Context()
    return _PROPAGATOR.extract({_TRACEPARENT: traceparent}, context=otel_context.Context())


@contextmanager
def attached(traceparent: str | None) -> Iterator[otel_context.Context]:
    """Make `traceparent` the current trace parent for the duration of the block."""
    ctx = context_from(traceparent)
    token = otel_context.attach(ctx)
    try:
        yield ctx
    finally:
        otel_context.detach(token)


def recording() -> bool:
    """Whether spans are recorded in this process: an SDK provider is installed (none is
    when `OTEL_SDK_DISABLED` is true)."""
    return isinstance(trace.get_tracer_provider(), TracerProvider)


def derived_trace_id(*parts: str) -> int:
    """A trace id that is the same wherever and whenever it is derived from `parts`."""
    return _digest(16, "trace", *parts)


def derived_span_id(*parts: str) -> int:
    """A span id that is the same wherever and whenever it is derived from `parts`."""
    return _digest(8, "span", *parts)


def context_of(trace_id: int, span_id: int) -> otel_context.Context | None:
    """The context whose parent is the span with these ids, whether or not it was recorded
    yet (or ever will be, by this process); None when nothing is recorded here.

    The sampling flag is what the sampler decides for a root span of `trace_id`, the same
    in every process, so a trace is recorded whole or not at all.
    """
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        return None
    decision = provider.sampler.should_sample(otel_context.Context(), trace_id, "derived")
    sampled = decision.decision is Decision.RECORD_AND_SAMPLE
    flags = trace.TraceFlags.SAMPLED if sampled else trace.TraceFlags.DEFAULT
    parent = trace.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(flags)
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(parent), otel_context.Context())


def traceparent_of(ctx: otel_context.Context | None) -> str | None:
    """The W3C traceparent of the span current in `ctx`; None for None or an empty one."""
    if ctx is None:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=ctx)
    return carrier.get(_TRACEPARENT)


def record_span(
    scope: str,
    name: str,
    *,
    trace_id: int,
    span_id: int,
    parent: otel_context.Context | None,
    start: datetime,
    end: datetime,
    attributes: Attributes = None,
    failed: str | None = None,
) -> None:
    """Record a span that has already ended, under ids fixed beforehand (`derived_span_id`).

    `parent` None records a root span of `trace_id`; otherwise the span joins the parent's
    trace (pass its trace id). `failed` is why the work failed: the span's error status. An
    end before the start (clocks of different producers) is recorded as a zero-length span.
    Outside a provider built by `build_tracer_provider` the ids cannot be fixed: the span is
    then recorded under fresh ids, and its children point at a span that is not there.
    """
    if not recording():
        return
    started = _nanoseconds(start)
    token = _pinned.set((trace_id, span_id))
    try:
        span = tracer(scope).start_span(
            name,
            context=parent or otel_context.Context(),
            attributes=attributes,
            start_time=started,
        )
    finally:
        _pinned.reset(token)
    if failed is not None:
        span.set_status(trace.Status(trace.StatusCode.ERROR, failed))
    span.end(end_time=max(started, _nanoseconds(end)))


class PinnableIds(IdGenerator):
    """Random ids, except for the span `record_span` opens: that one gets the ids it asks for."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()

    def generate_trace_id(self) -> int:
        pinned = _pinned.get()
        return pinned[0] if pinned is not None else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        pinned = _pinned.get()
        return pinned[1] if pinned is not None else self._random.generate_span_id()

    def is_trace_id_random(self) -> bool:
        # derived ids are digests: uniformly distributed, as ratio sampling needs
        return True


def _digest(size: int, kind: str, *parts: str) -> int:
    digest = hashlib.sha256("\x1f".join(("gpuop", kind, *parts)).encode()).digest()
    # an all-zero id is invalid in W3C trace context; a digest of zeros is not going to happen
    return int.from_bytes(digest[:size]) or 1


def _nanoseconds(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(microseconds=1) * 1000


def _resource(service: str, node: str | None, env: Mapping[str, str]) -> Resource:
    attributes: dict[str, str] = {}
    # An operator's explicit OTEL_SERVICE_NAME beats the name the code derives.
    if not env.get("OTEL_SERVICE_NAME"):
        attributes[SERVICE_NAME] = f"gpuop-{service}"
    if node is not None:
        attributes["host.name"] = node
        attributes["k8s.node.name"] = node
    return Resource.create(attributes)


def _exporter_names(env: Mapping[str, str]) -> list[str]:
    raw = env.get("OTEL_TRACES_EXPORTER", "").strip()
    if not raw:
        return ["otlp"] if any(env.get(v) for v in _OTLP_ENDPOINT_VARIABLES) else []
    names = [part.strip().lower() for part in raw.split(",")]
    return [name for name in names if name and name != "none"]


def _otlp_exporter() -> SpanExporter | None:
    try:
        module = importlib.import_module(OTLP_EXPORTER_MODULE)
    except ImportError:
        _log.warning(
            "OTEL_TRACES_EXPORTER asks for otlp, but %s is not installed "
            "(pip install opentelemetry-exporter-otlp-proto-http); spans will not be exported",
            OTLP_EXPORTER_MODULE,
        )
        return None
    exporter: SpanExporter = module.OTLPSpanExporter()
    return exporter
