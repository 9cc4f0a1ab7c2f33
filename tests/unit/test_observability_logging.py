"""The one logger setup: JSON lines with trace and correlation ids, and a text mode."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from gpuop.observability import logging as oblog

log = logging.getLogger("gpuop.test")


@pytest.fixture(autouse=True)
def restore_root_logger(monkeypatch) -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    monkeypatch.setattr(oblog, "_installed", None)
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def stream() -> io.StringIO:
    out = io.StringIO()
    oblog.configure_logging("discovery", node="gpu-node-1", stream=out)
    return out


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_line_carries_the_core_fields(stream):
    log.info("inventory of %s changed", "gpu-node-1")
    [line] = lines(stream)
    assert line["level"] == "INFO"
    assert line["logger"] == "gpuop.test"
    assert line["message"] == "inventory of gpu-node-1 changed"
    assert line["service"] == "discovery"
    assert line["node"] == "gpu-node-1"
    assert isinstance(line["time"], str)
    assert line["time"].endswith("Z")
    assert datetime.fromisoformat(line["time"]).utcoffset() == timedelta(0)
    assert "trace_id" not in line
    assert "correlation_id" not in line


def test_json_line_inside_a_span_carries_its_trace_and_span_ids(stream):
    provider = TracerProvider()
    with provider.get_tracer("test").start_as_current_span("handle") as span:
        log.info("handling")
    provider.shutdown()
    [line] = lines(stream)
    ctx = span.get_span_context()
    assert line["trace_id"] == trace.format_trace_id(ctx.trace_id)
    assert line["span_id"] == trace.format_span_id(ctx.span_id)


def test_json_line_inside_correlation_carries_the_correlation_id(stream):
    with oblog.correlation("saga-gpu-node-1-7"):
        log.info("inside")
        assert oblog.current_correlation_id() == "saga-gpu-node-1-7"
    log.info("outside")
    inside, outside = lines(stream)
    assert inside["correlation_id"] == "saga-gpu-node-1-7"
    assert "correlation_id" not in outside
    assert oblog.current_correlation_id() is None


def test_nested_correlation_restores_the_outer_id(stream):
    with oblog.correlation("rollout-1"):
        with oblog.correlation(None):
            log.info("cleared")
        log.info("outer again")
    cleared, outer = lines(stream)
    assert "correlation_id" not in cleared
    assert outer["correlation_id"] == "rollout-1"


async def test_correlation_is_private_to_each_task(stream):
    async def handle(correlation_id: str) -> None:
        with oblog.correlation(correlation_id):
            await asyncio.sleep(0)
            log.info("handled")

    await asyncio.gather(handle("saga-a"), handle("saga-b"))
    assert sorted(str(line["correlation_id"]) for line in lines(stream)) == ["saga-a", "saga-b"]


def test_extra_fields_are_included_and_own_fields_are_not_overwritten(stream):
    log.info("step done", extra={"step": "drain", "attempt": 2, "service": "spoof"})
    [line] = lines(stream)
    assert line["step"] == "drain"
    assert line["attempt"] == 2
    assert line["service"] == "discovery"
    assert line["extra_service"] == "spoof"


def test_extra_node_refines_the_process_node(stream):
    log.info("cordoned", extra={"node": "gpu-node-9"})
    assert lines(stream)[0]["node"] == "gpu-node-9"


def test_values_json_cannot_encode_are_rendered_as_text(stream):
    log.info("deadline", extra={"deadline": datetime(2025, 1, 2, 3, 4, 5)})
    assert lines(stream)[0]["deadline"] == "2025-01-02 03:04:05"


def test_exception_text_is_included(stream):
    try:
        raise ZeroDivisionError("no GPUs")
    except ZeroDivisionError:
        log.exception("validation crashed")
    [line] = lines(stream)
    assert line["level"] == "ERROR"
    assert "ZeroDivisionError: no GPUs" in str(line["exception"])
    assert "Traceback" in str(line["exception"])


def test_reconfiguring_replaces_the_handler_instead_of_duplicating_lines(stream):
    second = io.StringIO()
    oblog.configure_logging("discovery", stream=second)
    log.info("once")
    assert stream.getvalue() == ""
    assert len(second.getvalue().splitlines()) == 1


def test_level_filters_lower_records():
    out = io.StringIO()
    oblog.configure_logging("telemetry", level="warning", stream=out)
    log.info("dropped")
    log.warning("kept")
    assert [line["message"] for line in lines(out)] == ["kept"]


def test_unknown_level_is_refused():
    with pytest.raises(ValueError, match="VERBOSE"):
        oblog.configure_logging("telemetry", level="VERBOSE", stream=io.StringIO())


def test_text_mode_is_one_readable_line_with_key_values():
    out = io.StringIO()
    oblog.configure_logging("driver-manager", node="gpu-node-1", stream=out, json=False)
    with oblog.correlation("saga-1"):
        log.warning("unload failed", extra={"kernel_module": "nvidia"})
    [line] = out.getvalue().splitlines()
    assert "WARNING" in line
    assert "gpuop.test: unload failed" in line
    assert "node=gpu-node-1" in line
    assert "correlation_id=saga-1" in line
    assert "kernel_module=nvidia" in line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


def test_text_mode_puts_the_traceback_below_the_line():
    out = io.StringIO()
    oblog.configure_logging("driver-manager", stream=out, json=False)
    try:
        raise RuntimeError("module in use")
    except RuntimeError:
        log.exception("rmmod failed")
    first, *rest = out.getvalue().splitlines()
    assert first.endswith("gpuop.test: rmmod failed")
    assert rest[-1] == "RuntimeError: module in use"


def test_text_mode_escapes_what_would_forge_a_line_or_a_field():
    out = io.StringIO()
    oblog.configure_logging("discovery", stream=out, json=False)
    forged = "gpu-1\n2026-12-02T00:00:00.000Z INFO     gpuop.x: all good"
    log.warning("node %s is gone", forged, extra={"reason": "x node=gpu-9", "tty": "\x1b[2J"})
    [line] = out.getvalue().splitlines()
    assert "node gpu-1\\n2026-12-02T00:00:00.000Z INFO" in line
    assert 'reason="x node=gpu-9"' in line  # one field, not two
    assert 'tty="\\u001b[2J"' in line and "\x1b" not in line


def test_json_mode_keeps_one_record_on_one_line():
    out = io.StringIO()
    oblog.configure_logging("discovery", stream=out)
    log.warning("a\nb", extra={"reason": "c\nd"})
    [record] = lines(out)
    assert (record["message"], record["reason"]) == ("a\nb", "c\nd")
