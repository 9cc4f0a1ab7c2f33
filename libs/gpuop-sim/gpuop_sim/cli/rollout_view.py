"""Follows a rollout through the public events, as any external tool would: `gpuop demo`'s
view of the upgrade.

`follow` reads `<prefix>.evt.>` from the start of the stream and feeds each event to a
`Tracker`, which keeps what the views show: every node's upgrade state, attempt, running
driver (from discovery's inventories) and the reason of its last move, the latest events,
and the `RolloutOutcome`. Without a terminal (or with `--headless`) `follow` prints one line
per node transition; the live view (`gpuop_sim.cli.screens`) redraws from the tracker instead.
It returns once every node is done or failed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from gpuop.bus import Bus, BusError
from gpuop.bus.protocol import StoredMessage
from gpuop.events import (
    Envelope,
    Event,
    MalformedMessage,
    Payload,
    UnknownEventType,
    decode,
    subjects,
)
from gpuop.events.driver import Component, DriverLoaded
from gpuop.events.hardware import HardwareDiscovered, HardwareHeartbeat
from gpuop.events.kube import NodeObserved
from gpuop.events.upgrade import (
    TERMINAL_STATES,
    NodeUpgradeStateChanged,
    RolloutCompleted,
    RolloutFailed,
    RolloutProgress,
    RolloutStarted,
    UpgradeState,
)

LATEST = 8
"""Events the live view lists."""
READ_RETRIES = 5
QUIET = (HardwareHeartbeat, RolloutProgress, NodeObserved)
"""Events left out of the latest events: periodic, or told better by the table."""


@dataclass
class RolloutOutcome:
    """Where every node ended, as the events told it."""

    nodes: list[str]
    states: dict[str, UpgradeState] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def done(self) -> int:
        return sum(1 for s in self.states.values() if s is UpgradeState.UPGRADE_DONE)

    @property
    def failed(self) -> int:
        return sum(1 for s in self.states.values() if s is UpgradeState.UPGRADE_FAILED)

    @property
    def finished(self) -> bool:
        return all(self.states.get(n) in TERMINAL_STATES for n in self.nodes)

    def summary(self) -> str:
        return json.dumps(
            {
                "nodes": len(self.nodes),
                "done": self.done,
                "failed": self.failed,
                "seconds": round(self.seconds, 1),
            }
        )


@dataclass
class NodeRow:
    """One node as the live view shows it."""

    state: UpgradeState | None = None
    attempt: int | None = None
    driver: str | None = None
    """The GPU driver discovery last saw loaded; None while none is."""
    reason: str = ""


@dataclass(frozen=True)
class Seen:
    """One of the latest events."""

    elapsed: float
    """When it happened (its own time), in seconds from the start."""
    node: str
    kind: str
    """`domain.name`, e.g. `driver.installed`."""
    detail: str


@dataclass
class Tracker:
    """What the events told so far."""

    nodes: list[str]
    started: float = field(default_factory=time.monotonic)
    """`time.monotonic()` when the demo started; elapsed times count from it."""
    rows: dict[str, NodeRow] = field(default_factory=dict)
    latest: deque[Seen] = field(default_factory=lambda: deque(maxlen=LATEST))
    rollout: str = ""
    """The rollout's id, once it started; then `target_versions`."""
    target_versions: dict[str, str] = field(default_factory=dict)
    outcome: RolloutOutcome = field(init=False)
    wall_started: datetime = field(init=False)
    """The wall-clock time of `started`, to place the events' own times."""

    def __post_init__(self) -> None:
        self.outcome = RolloutOutcome(self.nodes)
        self.wall_started = datetime.now(UTC) - timedelta(seconds=self.elapsed)
        for node in self.nodes:
            self.rows.setdefault(node, NodeRow())

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def observe(self, envelope: Envelope, payload: Payload) -> str | None:
        """Take in one event; returns the progress line it makes, if any."""
        node = envelope.node
        row = self.rows.get(node)
        line = None
        if isinstance(payload, NodeUpgradeStateChanged) and row is not None:
            row.state, row.attempt, row.reason = payload.to_state, payload.attempt, payload.reason
            self.outcome.states[node] = payload.to_state
            if payload.to_state is UpgradeState.UPGRADE_FAILED:
                self.outcome.reasons[node] = payload.reason
            line = (
                f"{node:<14} {payload.from_state or '-'} -> {payload.to_state}"
                f"  (attempt {payload.attempt}; {payload.reason})"
            )
        elif isinstance(payload, HardwareDiscovered) and row is not None:
            row.driver = payload.driver_version
        elif (
            isinstance(payload, DriverLoaded)
            and payload.component is Component.GPU
            and row is not None
        ):
            # the driver-manager's word, seconds before discovery's next scan says it too: a
            # rollout that ends right after a load shows the version it loaded
            row.driver = payload.version
        elif isinstance(payload, RolloutStarted):
            self.rollout = payload.rollout_id
            self.target_versions = {str(c): v for c, v in payload.target_versions.items()}
        elif isinstance(payload, RolloutCompleted | RolloutFailed):
            line = f"rollout {type(payload).__name__[7:].lower()}"
        if isinstance(payload, Event) and not isinstance(payload, QUIET):
            kind = f"{payload.DOMAIN}.{payload.NAME}"
            where = "cluster" if node == subjects.CLUSTER else node
            at = (envelope.time - self.wall_started).total_seconds()
            self.latest.append(Seen(max(at, 0.0), where, kind, _detail(payload)))
        return None if line is None else f"[{self.elapsed:6.1f}s] {line}"


def _detail(payload: Payload) -> str:
    if isinstance(payload, NodeUpgradeStateChanged):
        return f"{payload.from_state or '-'} -> {payload.to_state}"
    for name in ("version", "driver_version", "reason", "message", "service"):
        value = getattr(payload, name, None)
        if value:
            return str(value)
    return ""


async def follow(bus: Bus, tracker: Tracker, *, print_lines: bool = True) -> RolloutOutcome:
    """Feed every event to `tracker` until every node is done or failed; print each
    transition when `print_lines`. A read that breaks off (a slow server) is taken up again
    after the last event seen, up to `READ_RETRIES` times."""
    subject = f"{bus.prefix}.evt.>"
    last: StoredMessage | None = None
    for retry in range(READ_RETRIES + 1):
        since = last.time if last is not None else None
        try:
            async for stored in bus.read(subject, since=since, follow=True):
                if last is not None and stored.seq <= last.seq:
                    continue  # read again from the same instant
                last = stored
                try:
                    envelope, payload = decode(stored.data)
                except (MalformedMessage, UnknownEventType):
                    continue
                line = tracker.observe(envelope, payload)
                if line is not None and print_lines:
                    print(line, flush=True)
                if tracker.outcome.finished:
                    tracker.outcome.seconds = tracker.elapsed
                    return tracker.outcome
        except BusError:
            if retry == READ_RETRIES:
                raise
            await asyncio.sleep(0.5)
    tracker.outcome.seconds = tracker.elapsed
    return tracker.outcome
