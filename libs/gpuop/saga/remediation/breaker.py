"""The circuit breaker: at most `remediation.maxPerHour` remediations start in any sliding
hour across the cluster.

Pure, over the start times of the remediations decided before (the runtime keeps them in
the records, `gpuop replay` reads them from the `RemediationStarted` events of the log, in
the order they were decided), so the same starts give the same answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

WINDOW = timedelta(hours=1)


def recent(starts: Iterable[datetime], now: datetime) -> list[datetime]:
    """The starts inside the hour before `now`."""
    return sorted(t for t in starts if now - WINDOW < t <= now)


def allows(starts: Iterable[datetime], now: datetime, max_per_hour: int) -> bool:
    """Whether another remediation may start at `now` (0: no limit)."""
    return max_per_hour == 0 or len(recent(starts, now)) < max_per_hour


def reopens(starts: Iterable[datetime], now: datetime, max_per_hour: int) -> datetime | None:
    """When the tripped breaker lets a start through again; None when it is not tripped."""
    within = recent(starts, now)
    if max_per_hour == 0 or len(within) < max_per_hour:
        return None
    return within[len(within) - max_per_hour] + WINDOW
