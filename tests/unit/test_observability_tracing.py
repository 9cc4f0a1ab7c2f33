"""Tracing setup from OTEL_* variables, and traceparent propagation through `attached`."""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Iterator, Sequence
from typing import ClassVar

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from gpuop.observability import tracing

VALID_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
VALID_SPAN_ID = "00f067aa0ba902b7"


@pytest.fixture
def tracer() -> Iterator[trace.Tracer]:
    """A tracer of a local provider: the process-wide provider is left alone."""
    provider = TracerProvider()
    yield provider.get_tracer("test")
    provider.shutdown()


def test_traceparent_round_trip_continues_the_producers_trace(tracer):
    with tracer.start_as_current_span("publish") as producer:
        traceparent = tracing.current_traceparent()
    assert traceparent is not None

    with tracing.attached(traceparent), tracer.start_as_current_span("handle") as child:
        pass

    parent_context = producer.get_span_context()
    assert child.get_span_context().trace_id == parent_context.trace_id
    assert child.parent is not None
    assert child.parent.span_id == parent_context.span_id


def test_current_traceparent_is_w3c_format_inside_a_span(tracer):
    with tracer.start_as_current_span("work") as span:
        traceparent = tracing.current_traceparent()
        ctx = span.get_span_context()
    assert traceparent == (
        f"00-{trace.format_trace_id(ctx.trace_id)}-{trace.format_span_id(ctx.span_id)}"
        f"-{ctx.trace_flags:02x}"
    )


def test_current_traceparent_is_none_outside_any_span():
    assert tracing.current_traceparent() is None


def test_context_from_a_valid_traceparent_carries_its_ids():
    ctx = tracing.context_from(f"00-{VALID_TRACE_ID}-{VALID_SPAN_ID}-01")
    span_context = trace.get_current_span(ctx).get_span_context()
    assert span_context.is_remote
    assert trace.format_trace_id(span_context.trace_id) == VALID_TRACE_ID
    assert trace.format_span_id(span_context.span_id) == VALID_SPAN_ID


@pytest.mark.parametrize(
    "traceparent",
    [
        None,
        "",
        "garbage",
        f"00-{VALID_TRACE_ID}-{VALID_SPAN_ID}",
        f"00-{'0' * 32}-{VALID_SPAN_ID}-01",
        f"00-{VALID_TRACE_ID}-{'0' * 16}-01",
        f"ff-{VALID_TRACE_ID}-{VALID_SPAN_ID}-01",
        "x" * 1000,
    ],
)
def test_missing_or_malformed_traceparent_yields_an_empty_context(traceparent):
    ctx = tracing.context_from(traceparent)
    assert not trace.get_current_span(ctx).get_span_context().is_valid


def test_attached_with_a_malformed_traceparent_starts_a_new_trace(tracer):
    with (
        tracer.start_as_current_span("consumer loop") as ambient,
        tracing.attached("00-not-a-traceparent"),
        tracer.start_as_current_span("handle") as h,
    ):
        pass
    assert h.parent is None
    assert h.get_span_context().trace_id != ambient.get_span_context().trace_id


def test_attached_restores_the_previous_context_on_exit(tracer):
    with tracer.start_as_current_span("outer") as outer:
        with tracing.attached(f"00-{VALID_TRACE_ID}-{VALID_SPAN_ID}-01"):
            assert trace.get_current_span() is not outer
        assert trace.get_current_span() is outer


def test_attached_restores_the_context_when_the_block_raises():
    with pytest.raises(RuntimeError), tracing.attached(f"00-{VALID_TRACE_ID}-{VALID_SPAN_ID}-01"):
        raise RuntimeError("handler failed")
    assert not trace.get_current_span().get_span_context().is_valid


def test_tracer_returns_a_tracer_for_the_module():
    assert isinstance(tracing.tracer(__name__), trace.Tracer)


def test_sdk_disabled_builds_no_provider():
    assert tracing.build_tracer_provider("discovery", environ={"OTEL_SDK_DISABLED": "TRUE"}) is None


def test_provider_resource_names_the_service_and_node():
    provider = tracing.build_tracer_provider("discovery", node="gpu-node-1", environ={})
    assert provider is not None
    attributes = provider.resource.attributes
    assert attributes["service.name"] == "gpuop-discovery"
    assert attributes["host.name"] == "gpu-node-1"
    assert attributes["k8s.node.name"] == "gpu-node-1"
    provider.shutdown()


def test_explicit_otel_service_name_wins(monkeypatch):
    # The SDK's resource detector reads the real environment; the builder reads `environ`.
    monkeypatch.setenv("OTEL_SERVICE_NAME", "custom")
    provider = tracing.build_tracer_provider("discovery", environ={"OTEL_SERVICE_NAME": "custom"})
    assert provider is not None
    assert provider.resource.attributes["service.name"] == "custom"
    provider.shutdown()


def test_provider_without_exporter_still_gives_spans_ids():
    provider = tracing.build_tracer_provider("telemetry", environ={})
    assert provider is not None
    with provider.get_tracer("test").start_as_current_span("scrape"):
        assert tracing.current_traceparent() is not None
    provider.shutdown()


def test_console_exporter_writes_finished_spans_to_stdout(capsys):
    environ = {"OTEL_TRACES_EXPORTER": "console"}
    provider = tracing.build_tracer_provider("telemetry", environ=environ)
    assert provider is not None
    with provider.get_tracer("test").start_as_current_span("collect-gpu-metrics"):
        pass
    provider.shutdown()
    assert "collect-gpu-metrics" in capsys.readouterr().out


def test_missing_otlp_package_logs_one_warning_and_continues(monkeypatch, caplog):
    # A None entry in sys.modules makes the import fail as if the package were absent.
    monkeypatch.setitem(sys.modules, tracing.OTLP_EXPORTER_MODULE, None)
    environ = {"OTEL_TRACES_EXPORTER": "otlp"}
    with caplog.at_level(logging.WARNING, logger=tracing.__name__):
        provider = tracing.build_tracer_provider("driver-manager", environ=environ)
    assert provider is not None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "opentelemetry-exporter-otlp-proto-http" in warnings[0].getMessage()
    provider.shutdown()


class _RecordingExporter(SpanExporter):
    exported: ClassVar[list[str]] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exported.extend(span.name for span in spans)
        return SpanExportResult.SUCCESS


def test_otlp_endpoint_without_exporter_variable_selects_otlp(monkeypatch):
    fake = types.ModuleType(tracing.OTLP_EXPORTER_MODULE)
    fake.OTLPSpanExporter = _RecordingExporter  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, tracing.OTLP_EXPORTER_MODULE, fake)
    monkeypatch.setattr(_RecordingExporter, "exported", [])
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    provider = tracing.build_tracer_provider("upgrade-orchestrator", environ=environ)
    assert provider is not None
    with provider.get_tracer("test").start_as_current_span("advance-saga"):
        pass
    provider.shutdown()
    assert _RecordingExporter.exported == ["advance-saga"]


def test_unsupported_exporter_is_ignored_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger=tracing.__name__):
        provider = tracing.build_tracer_provider("x", environ={"OTEL_TRACES_EXPORTER": "zipkin"})
    assert provider is not None
    assert "zipkin" in caplog.text
    provider.shutdown()


@pytest.fixture
def installs(monkeypatch) -> list[trace.TracerProvider]:
    """Captures what configure_tracing would install, keeping the process-wide one intact."""
    installed: list[trace.TracerProvider] = []
    monkeypatch.setattr(tracing, "_configured", False)
    monkeypatch.setattr(trace, "set_tracer_provider", installed.append)
    for variable in ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(variable, raising=False)
    return installed


def test_configure_tracing_with_sdk_disabled_installs_nothing(monkeypatch, installs):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    tracing.configure_tracing("discovery", node="gpu-node-1")
    assert installs == []
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)


def test_configure_tracing_installs_once_per_process(installs):
    tracing.configure_tracing("discovery", node="gpu-node-1")
    tracing.configure_tracing("telemetry")
    assert len(installs) == 1
    provider = installs[0]
    assert isinstance(provider, TracerProvider)
    assert provider.resource.attributes["service.name"] == "gpuop-discovery"
    provider.shutdown()
