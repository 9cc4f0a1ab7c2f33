"""Spans under derived ids: the same ids from the same parts anywhere, children parented on
a span before it is recorded, the span recorded later with its ids and real start."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from opentelemetry import trace

from gpuop.observability import tracing
from tests.support.spans import recorded_spans, untraced

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_derived_ids_depend_only_on_their_parts():
    assert tracing.derived_trace_id("saga-1", "1") == tracing.derived_trace_id("saga-1", "1")
    assert tracing.derived_trace_id("saga-1", "1") != tracing.derived_trace_id("saga-1", "2")
    assert tracing.derived_span_id("saga-1", "1", "drain") != tracing.derived_span_id(
        "saga-1", "1", "cordon"
    )
    assert 0 < tracing.derived_trace_id("x") < 2**128
    assert 0 < tracing.derived_span_id("x") < 2**64


def test_a_span_recorded_later_is_the_parent_its_children_named_before():
    trace_id, root_id = tracing.derived_trace_id("saga"), tracing.derived_span_id("saga", "root")
    step_id = tracing.derived_span_id("saga", "step")
    with recorded_spans() as exporter:
        parent = tracing.context_of(trace_id, step_id)
        with tracing.tracer(__name__).start_as_current_span("handle", context=parent) as child:
            traceparent = tracing.current_traceparent()
        tracing.record_span(
            __name__, "step", trace_id=trace_id, span_id=step_id,
            parent=tracing.context_of(trace_id, root_id), start=T0, end=T0 + timedelta(seconds=3),
            attributes={"gpuop.upgrade.step": "drain"},
        )  # fmt: skip
        tracing.record_span(
            __name__, "root", trace_id=trace_id, span_id=root_id, parent=None, start=T0, end=T0
        )
        handle, step, root = exporter.get_finished_spans()

    assert child.get_span_context().trace_id == trace_id
    assert traceparent == f"00-{trace_id:032x}-{child.get_span_context().span_id:016x}-01"
    assert handle.parent is not None and handle.parent.span_id == step_id
    assert (step.context.trace_id, step.context.span_id) == (trace_id, step_id)
    assert step.parent is not None and step.parent.span_id == root_id
    assert step.end_time is not None and step.start_time is not None
    assert step.end_time - step.start_time == 3 * 10**9
    assert step.attributes == {"gpuop.upgrade.step": "drain"}
    assert (root.context.trace_id, root.context.span_id, root.parent) == (trace_id, root_id, None)


def test_a_recorded_span_that_failed_ends_as_an_error_and_never_before_it_started():
    with recorded_spans() as exporter:
        tracing.record_span(
            __name__, "unload", trace_id=1, span_id=2, parent=None,
            start=T0, end=T0 - timedelta(seconds=1), failed="module in use",
        )  # fmt: skip
        [span] = exporter.get_finished_spans()
    assert span.status.status_code is trace.StatusCode.ERROR
    assert span.status.description == "module in use"
    assert span.end_time == span.start_time


def test_the_sampler_decides_for_a_derived_trace_as_for_a_root(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    with recorded_spans() as exporter:
        traceparent = tracing.traceparent_of(tracing.context_of(7, 8))
        tracing.record_span(__name__, "root", trace_id=7, span_id=8, parent=None, start=T0, end=T0)
        assert exporter.get_finished_spans() == ()
    assert traceparent == f"00-{7:032x}-{8:016x}-00"


def test_without_a_provider_nothing_is_derived_or_recorded():
    with untraced():
        assert not tracing.recording()
        assert tracing.context_of(7, 8) is None
        assert tracing.traceparent_of(None) is None
        tracing.record_span(__name__, "root", trace_id=7, span_id=8, parent=None, start=T0, end=T0)
