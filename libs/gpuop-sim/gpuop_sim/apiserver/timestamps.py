"""Server time and the canonical form of Kubernetes timestamps.

A real API server decodes every write into typed structs, so ``metav1.Time`` fields come
back in whole seconds (``2026-01-01T00:00:00Z``) and ``metav1.MicroTime`` fields with
microseconds (``2026-01-01T00:00:00.000000Z``), whatever the client sent; a value without a
timezone is rejected, and so is a ``MicroTime`` without exactly six fractional digits:
kube-apiserver parses it with Go's layout ``2006-01-02T15:04:05.000000Z07:00``, so
``...:01.5+00:00`` and ``...:01+00:00`` are 400s there. The registry applies the same
normalisation to built-in kinds through :func:`normalize_times`, and stamps server-set times
with the `now()` of the `gpuop.clocks.Clock` it is given, so tests can control it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from gpuop_sim.apiserver import errors


def format_time(moment: datetime) -> str:
    """``metav1.Time``: RFC 3339 in UTC, whole seconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(moment: datetime) -> str:
    """``metav1.MicroTime``: RFC 3339 in UTC with six fractional digits."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    """Parse an RFC 3339 timestamp; raises ValueError when it has no timezone."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no timezone")
    return moment


MICRO_LAYOUT = "2006-01-02T15:04:05.000000Z07:00"
_MICRO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")


def parse_micro_time(text: str) -> datetime:
    """Parse a ``metav1.MicroTime`` as kube-apiserver does; ValueError in its words."""
    if not _MICRO.fullmatch(text):
        rest = text[19:] if len(text) > 19 else text
        raise ValueError(
            f'parsing time "{text}" as "{MICRO_LAYOUT}": cannot parse "{rest}" as ".000000"'
        )
    return parse_time(text)


TIME_FIELDS = frozenset(
    {
        "lastTransitionTime",
        "lastHeartbeatTime",
        "lastProbeTime",
        "lastUpdateTime",
        "timeAdded",
        "firstTimestamp",
        "lastTimestamp",
        "startTime",
        "startedAt",
        "finishedAt",
    }
)
MICRO_TIME_FIELDS = frozenset({"acquireTime", "renewTime", "eventTime", "lastObservedTime"})

# Subtrees holding free-form user data, whose keys are not field names.
_OPAQUE = frozenset({"metadata", "data", "binaryData", "labels", "annotations", "nodeSelector"})


def normalize_times(obj: Any, kind: str) -> None:
    """Rewrite known timestamp fields of a built-in object in place to canonical form."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in _OPAQUE:
                continue
            if isinstance(value, str) and key in MICRO_TIME_FIELDS:
                try:
                    moment = parse_micro_time(value)
                except ValueError as error:
                    raise errors.bad_request(
                        f'{kind} in version "v1" cannot be handled as a {kind}: {error}'
                    ) from None
                obj[key] = format_micro_time(moment)
            elif isinstance(value, str) and key in TIME_FIELDS:
                try:
                    moment = parse_time(value)
                except ValueError as error:
                    raise errors.bad_request(
                        f'{kind} in version "v1" cannot be handled as a {kind}: '
                        f"parsing time {value!r}: {error}"
                    ) from None
                obj[key] = format_time(moment)
            else:
                normalize_times(value, kind)
    elif isinstance(obj, list):
        for item in obj:
            normalize_times(item, kind)
