"""Spans recorded in memory while a test runs, and the shape of the trace they form.

`recorded_spans` installs a provider built by `tracing.build_tracer_provider` (so the ids the
orchestrator derives are honoured) as the process-wide one, as `configure_tracing` does in a
service, exporting to memory; the provider found before is put back afterwards (OpenTelemetry
allows setting it once per process, so this reaches into the API module's global, as
OpenTelemetry's own test utilities do). `untraced` removes any for the block.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gpuop.observability import tracing


@contextmanager
def recorded_spans(service: str = "test") -> Iterator[InMemorySpanExporter]:
    """Every span ended in this process during the block, kept by the exporter yielded."""
    provider = tracing.build_tracer_provider(service, environ={})
    assert provider is not None
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    before = trace._TRACER_PROVIDER
    trace._TRACER_PROVIDER = provider
    try:
        yield exporter
    finally:
        trace._TRACER_PROVIDER = before
        provider.shutdown()


@contextmanager
def untraced() -> Iterator[None]:
    """No provider in this process for the block, as `configure_tracing` leaves it when
    `OTEL_SDK_DISABLED` is true (whatever an earlier test installed)."""
    before = trace._TRACER_PROVIDER
    trace._TRACER_PROVIDER = None
    try:
        yield
    finally:
        trace._TRACER_PROVIDER = before


def one_tree(spans: Sequence[ReadableSpan]) -> ReadableSpan:
    """The root of `spans`, after checking that they form one tree: one trace, one span
    without a parent, and every other span's parent among them."""
    assert spans, "no spans were recorded"
    traces = {span.context.trace_id for span in spans}
    assert len(traces) == 1, f"{len(traces)} traces: {describe(spans)}"
    roots = [span for span in spans if span.parent is None]
    assert len(roots) == 1, f"roots {[r.name for r in roots]} in {describe(spans)}"
    ids = {span.context.span_id for span in spans}
    assert len(ids) == len(spans), f"span ids repeat: {describe(spans)}"
    orphans = [span.name for span in spans if span.parent and span.parent.span_id not in ids]
    assert not orphans, f"parents missing for {orphans} in {describe(spans)}"
    return roots[0]


def ancestry(span: ReadableSpan, spans: Sequence[ReadableSpan]) -> list[str]:
    """The names from `span` up to its root."""
    by_id = {s.context.span_id: s for s in spans}
    names = [span.name]
    while span.parent is not None:
        span = by_id[span.parent.span_id]
        names.append(span.name)
    return names


def named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def describe(spans: Sequence[ReadableSpan]) -> str:
    return ", ".join(
        f"{s.name}[{s.context.span_id:016x}<-{s.parent.span_id if s.parent else 0:016x}]"
        for s in spans
    )
