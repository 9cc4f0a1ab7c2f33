"""The one logger setup of every gpuop process: JSON lines for machines, plain text for people.

A service calls `configure_logging` once at start (again to change the level or stream; the
handler is replaced, never duplicated). Code everywhere else just uses
`logging.getLogger(__name__)` and passes structured fields as `extra={...}`.

Each JSON line carries `time` (RFC 3339, UTC), `level`, `logger`, `message`, `service`,
`node`, the current span's `trace_id` and `span_id` (from OpenTelemetry, see `tracing`),
the `correlation_id` of the saga or rollout being worked on, `exception` and `stack` when
present, and every `extra` field. Fields without a value are left out.

The bus consumer wraps each handler in `correlation(envelope.correlationid)`, so every line
a handler logs names the saga it belongs to without threading the id through calls.
"""

from __future__ import annotations

import json as jsonlib
import logging
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TextIO

from opentelemetry import trace

_correlation_id: ContextVar[str | None] = ContextVar("gpuop_correlation_id", default=None)

# Everything a LogRecord has by itself; whatever else is on a record came from `extra`.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}

# Fields the formatter owns. An `extra` may refine `node` and `correlation_id` (a cluster
# service logging about one node, say); an `extra` colliding with the others is renamed.
_OWN_FIELDS = frozenset(
    {"time", "level", "logger", "message", "service", "trace_id", "span_id", "exception", "stack"}
)

_installed: logging.Handler | None = None


@contextmanager
def correlation(correlation_id: str | None) -> Iterator[None]:
    """Tag every log line inside the block with `correlation_id` (None clears it)."""
    token = _correlation_id.set(correlation_id)
    try:
        yield
    finally:
        _correlation_id.reset(token)


def current_correlation_id() -> str | None:
    """The correlation id set by the innermost enclosing `correlation` block."""
    return _correlation_id.get()


def configure_logging(
    service: str,
    *,
    node: str | None = None,
    level: str = "INFO",
    stream: TextIO | None = None,
    json: bool = True,
) -> None:
    """Send the root logger's records to `stream` (default stderr), one line each.

    Raises ValueError for a level name `logging` does not know.
    """
    global _installed
    numeric_level = logging.getLevelNamesMapping().get(level.strip().upper())
    if numeric_level is None:
        raise ValueError(f"unknown log level {level!r}")
    formatter: logging.Formatter = (
        JsonFormatter(service, node=node) if json else TextFormatter(service, node=node)
    )
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    if _installed is not None:
        root.removeHandler(_installed)
    root.addHandler(handler)
    root.setLevel(numeric_level)
    _installed = handler


class _ServiceFormatter(logging.Formatter):
    """A formatter of one service's records (on one node): both formats carry the same
    fields."""

    def __init__(self, service: str, *, node: str | None = None) -> None:
        super().__init__()
        self._service = service
        self._node = node

    def _fields(self, record: logging.LogRecord) -> dict[str, Any]:
        return _fields(record, self, self._service, self._node)


class JsonFormatter(_ServiceFormatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        return jsonlib.dumps(
            self._fields(record),
            default=str,
            ensure_ascii=False,
            separators=(",", ":"),
        )


class TextFormatter(_ServiceFormatter):
    """A line a person reads at a terminal: time, level, logger, message, then key=value."""

    def format(self, record: logging.LogRecord) -> str:
        fields = self._fields(record)
        head = f"{fields.pop('time')} {fields.pop('level'):<8} {fields.pop('logger')}: "
        head += _escaped(str(fields.pop("message")))
        fields.pop("service")
        exception = fields.pop("exception", None)
        stack = fields.pop("stack", None)
        tail = " ".join(f"{_escaped(str(key))}={_value(value)}" for key, value in fields.items())
        lines = [f"{head}  {tail}" if tail else head]
        lines.extend(str(block) for block in (exception, stack) if block)
        return "\n".join(lines)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escaped(text: str) -> str:
    """`text` on one line: a newline, a carriage return or a terminal escape in a message or
    a field (a node name, a reason another process sent) would otherwise forge log lines or
    rewrite the terminal; each becomes its backslash escape."""
    return _CONTROL.sub(lambda found: found.group().encode("unicode_escape").decode(), text)


def _value(value: object) -> str:
    """A field's value for `key=value`: quoted (JSON) when it holds a space, a quote or an
    `=`, so one field cannot pass for several."""
    text = str(value)
    if text and not any(c in text for c in ' "=') and not _CONTROL.search(text):
        return text
    return jsonlib.dumps(text, ensure_ascii=False)


def _fields(
    record: logging.LogRecord,
    formatter: logging.Formatter,
    service: str,
    node: str | None,
) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "time": _rfc3339(record.created),
        "level": record.levelname,
        "logger": record.name,
        "message": record.getMessage(),
        "service": service,
    }
    if node is not None:
        fields["node"] = node
    span_context = trace.get_current_span().get_span_context()
    if span_context.is_valid:
        fields["trace_id"] = trace.format_trace_id(span_context.trace_id)
        fields["span_id"] = trace.format_span_id(span_context.span_id)
    correlation_id = _correlation_id.get()
    if correlation_id is not None:
        fields["correlation_id"] = correlation_id
    if record.exc_info:
        fields["exception"] = formatter.formatException(record.exc_info)
    elif record.exc_text:
        fields["exception"] = record.exc_text
    if record.stack_info:
        fields["stack"] = formatter.formatStack(record.stack_info)
    for key, value in vars(record).items():
        if key in _RECORD_ATTRIBUTES or key.startswith("_"):
            continue
        fields[f"extra_{key}" if key in _OWN_FIELDS else key] = value
    return fields


def _rfc3339(timestamp: float) -> str:
    moment = datetime.fromtimestamp(timestamp, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
