"""Follows a rollout through the public events, as any external tool would: `gpuop demo`'s
view of its sagas.

`follow` reads `<prefix>.evt.>` from the start of the stream and feeds each event to a
`Tracker`, which keeps what the views show: every node's saga (its kind, `upgrade`,
`remediation` or `mig`, and state), attempt, running driver (from discovery's inventories)
and the reason of its last move, the latest events, and the `RolloutOutcome`. For the
demo's other scenarios it also keeps each node's remediation or MIG reconfiguration
(`SagaRun`: states, times, GPUs) and the pods the device plugin named as holders of its
GPUs. Without a terminal (or with `--headless`) `follow` prints one line per node
transition; the live view (`gpuop_sim.cli.screens`) redraws from the tracker instead. It
returns once every node's upgrade is done or failed, or, with `Tracker.targets`, once every
target's saga of `Tracker.kind` is.
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
from gpuop.events.device import DeviceHealthChanged
from gpuop.events.device_api import TERMINAL_STATES as DEVICE_API_TERMINAL_STATES
from gpuop.events.device_api import (
    DeviceApiState,
    DeviceApiSwitchStarted,
    NodeDeviceApiStateChanged,
)
from gpuop.events.device_api_commands import DeviceApiApplied
from gpuop.events.driver import Component, DriverLoaded
from gpuop.events.hardware import HardwareDiscovered, HardwareHeartbeat
from gpuop.events.kube import NodeObserved
from gpuop.events.mig import (
    MigReconfigurationStarted,
    MigState,
    NodeMigStateChanged,
)
from gpuop.events.remediation import TERMINAL_STATES as REMEDIATION_TERMINAL_STATES
from gpuop.events.remediation import (
    NodeRemediationStateChanged,
    RemediationStarted,
    RemediationState,
)
from gpuop.events.remediation_commands import GpuHoldersListed
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


SagaState = UpgradeState | RemediationState | MigState | DeviceApiState
UPGRADE, REMEDIATION, MIG, DEVICE_API = "upgrade", "remediation", "mig", "device-api"
"""The saga kinds the view names."""
DONE_STATES = frozenset(
    {UpgradeState.UPGRADE_DONE, RemediationState.DONE, MigState.MIG_CONFIG_DONE,
     DeviceApiState.DONE}
)  # fmt: skip
FAILED_STATES = frozenset(
    {UpgradeState.UPGRADE_FAILED, RemediationState.FAILED, MigState.MIG_CONFIG_FAILED,
     DeviceApiState.FAILED}
)  # fmt: skip
REMEDIATION_FOLLOWED_TO = REMEDIATION_TERMINAL_STATES | {RemediationState.REPLACEMENT_REQUIRED}
"""Where the demo stops following a remediation: its ends, and the hand-over for new
hardware (the saga waits there for people, as long as they take)."""
MIG_TERMINAL_STATES = frozenset({MigState.MIG_CONFIG_DONE, MigState.MIG_CONFIG_FAILED})
SAGA_MOVES = (NodeRemediationStateChanged, NodeMigStateChanged, NodeDeviceApiStateChanged)
"""The state changes of the kinds a scenario follows (`SagaRun`)."""
SAGA_STARTS = (RemediationStarted, MigReconfigurationStarted, DeviceApiSwitchStarted)


@dataclass
class SagaRun:
    """One node's remediation, MIG reconfiguration or device-API switch, as its public
    events told it."""

    saga_id: str
    started: datetime
    """When it started (its start event's own time, else its first state change's)."""
    state: RemediationState | MigState | DeviceApiState
    ended: datetime | None = None
    """When it reached a terminal state."""
    reason: str = ""
    gpus: tuple[str, ...] = ()
    """The GPUs remediated (none for a MIG reconfiguration)."""
    config_state: str = ""
    """`nvidia.com/mig.config.state` the last move set (MIG only)."""
    states: list[str] = field(default_factory=list)
    """Every state it went through, in order."""

    @property
    def seconds(self) -> float | None:
        return None if self.ended is None else (self.ended - self.started).total_seconds()


@dataclass
class NodeRow:
    """One node as the live view shows it."""

    kind: str = ""
    """The kind of the saga whose state the row shows (`upgrade`, `remediation`, `mig`)."""
    state: SagaState | None = None
    attempt: int | None = None
    driver: str | None = None
    """The GPU driver discovery last saw loaded; None while none is."""
    api: str = ""
    """The kubelet API its device plugin last said it serves (`device-plugin`, `dra`; `-off`
    after it while not serving); empty: it said nothing."""
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
    kind: str = UPGRADE
    """The kind of saga the demo's scenario follows."""
    targets: list[str] | None = None
    """The nodes whose saga of `kind` ends the follow; None: every node's upgrade; empty:
    not chosen yet (the follow goes on)."""
    runs: dict[str, SagaRun] = field(default_factory=dict)
    """Each node's latest remediation or MIG reconfiguration."""
    holders: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Per node, the pods (`namespace/name`) the device plugin last named as holders."""
    unhealthy: dict[str, set[str]] = field(default_factory=dict)
    """Per node, the GPUs telemetry reported unhealthy and not yet healthy again."""
    echo: bool = False
    """Print each `note` as a progress line (no live view)."""
    pending: set[str] = field(default_factory=set)
    """Targets the scenario still has a fault to put on: the follow waits for them even
    when their latest saga ended."""

    def __post_init__(self) -> None:
        self.outcome = RolloutOutcome(self.nodes)
        self.wall_started = datetime.now(UTC) - timedelta(seconds=self.elapsed)
        for node in self.nodes:
            self.rows.setdefault(node, NodeRow())

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def finished(self) -> bool:
        """Every node's upgrade ended, or, with `targets`, every target's saga of `kind`."""
        if self.targets is None:
            return self.outcome.finished
        return (
            bool(self.targets)
            and not self.pending
            and all(
                (run := self.runs.get(node)) is not None and run.ended is not None
                for node in self.targets
            )
        )

    def counts(self) -> tuple[int, int, int]:
        """Done, failed and under way: of the upgrades, or of the targets' sagas."""
        if self.targets is None:
            outcome = self.outcome
            moving = sum(
                1
                for state in outcome.states.values()
                if state not in (UpgradeState.UPGRADE_DONE, UpgradeState.UPGRADE_FAILED)
                and state is not UpgradeState.UPGRADE_REQUIRED
            )
            return outcome.done, outcome.failed, moving
        runs = [self.runs[n] for n in self.targets if n in self.runs]
        done = sum(1 for run in runs if run.state in DONE_STATES)
        failed = sum(1 for run in runs if run.state in FAILED_STATES)
        return done, failed, len(runs) - done - failed

    def note(self, node: str, what: str, detail: str) -> None:
        """Something seen outside the events (a node's taint, its condition), as one of the
        latest events; printed as a progress line too when `echo`."""
        self.latest.append(Seen(self.elapsed, node, what, detail))
        if self.echo:
            print(f"[{self.elapsed:6.1f}s] {node:<14} {what}: {detail}", flush=True)

    def observe(self, envelope: Envelope, payload: Payload) -> str | None:
        """Take in one event; returns the progress line it makes, if any."""
        node = envelope.node
        row = self.rows.get(node)
        line = None
        if isinstance(payload, NodeUpgradeStateChanged) and row is not None:
            row.state, row.attempt, row.reason = payload.to_state, payload.attempt, payload.reason
            row.kind = UPGRADE
            self.outcome.states[node] = payload.to_state
            if payload.to_state is UpgradeState.UPGRADE_FAILED:
                self.outcome.reasons[node] = payload.reason
            line = (
                f"{node:<14} {payload.from_state or '-'} -> {payload.to_state}"
                f"  (attempt {payload.attempt}; {payload.reason})"
            )
        elif isinstance(payload, SAGA_MOVES) and row:
            line = self._saga_moved(node, row, envelope.time, payload)
        elif isinstance(payload, SAGA_STARTS) and row:
            self._saga_started(node, row, envelope.time, payload)
        elif isinstance(payload, DeviceApiApplied) and row is not None:
            row.api = f"{payload.api}{'' if payload.serving else '-off'}"
        elif isinstance(payload, GpuHoldersListed):
            self.holders[node] = tuple(f"{p.namespace}/{p.name}" for p in payload.pods)
        elif isinstance(payload, DeviceHealthChanged):
            unhealthy = self.unhealthy.setdefault(node, set())
            if payload.healthy:
                unhealthy.discard(payload.gpu_uuid)
            else:
                unhealthy.add(payload.gpu_uuid)
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

    def _saga_started(
        self,
        node: str,
        row: NodeRow,
        at: datetime,
        payload: RemediationStarted | MigReconfigurationStarted | DeviceApiSwitchStarted,
    ) -> None:
        first: RemediationState | MigState | DeviceApiState
        if isinstance(payload, RemediationStarted):
            first = RemediationState.ADMISSION_REQUIRED
            row.kind, gpus = REMEDIATION, tuple(payload.unhealthy)
        elif isinstance(payload, DeviceApiSwitchStarted):
            first, gpus = DeviceApiState.SWITCH_REQUIRED, ()
            row.kind = DEVICE_API
        else:
            first, gpus = MigState.MIG_CONFIG_REQUIRED, ()
            row.kind = MIG
        row.state, row.attempt, row.reason = first, 1, "started"
        self.runs[node] = SagaRun(payload.saga_id, at, first, gpus=gpus, states=[str(first)])

    def _saga_moved(
        self,
        node: str,
        row: NodeRow,
        at: datetime,
        payload: NodeRemediationStateChanged | NodeMigStateChanged | NodeDeviceApiStateChanged,
    ) -> str:
        kind = {
            NodeRemediationStateChanged: REMEDIATION,
            NodeMigStateChanged: MIG,
            NodeDeviceApiStateChanged: DEVICE_API,
        }[type(payload)]
        row.kind, row.state = kind, payload.to_state
        row.attempt, row.reason = payload.attempt, payload.reason
        run = self.runs.get(node)
        if run is None or run.saga_id != payload.saga_id:
            run = self.runs[node] = SagaRun(payload.saga_id, at, payload.to_state)
        run.state, run.reason = payload.to_state, payload.reason
        run.states.append(str(payload.to_state))
        if isinstance(payload, NodeRemediationStateChanged):
            run.gpus = payload.gpu_uuids or run.gpus
            ended = payload.to_state in REMEDIATION_FOLLOWED_TO
        elif isinstance(payload, NodeDeviceApiStateChanged):
            ended = payload.to_state in DEVICE_API_TERMINAL_STATES
        else:
            run.config_state = str(payload.config_state)
            ended = payload.to_state in MIG_TERMINAL_STATES
        if ended:
            run.ended = at
        return (
            f"{node:<14} {kind}: {payload.from_state or '-'} -> {payload.to_state}"
            f"  (attempt {payload.attempt}; {payload.reason})"
        )


def _detail(payload: Payload) -> str:
    if isinstance(payload, DeviceApiApplied):
        return f"{payload.api} {'serving' if payload.serving else 'not serving'}"
    if isinstance(
        payload, NodeUpgradeStateChanged | NodeRemediationStateChanged | NodeDeviceApiStateChanged
    ):
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
                if tracker.finished:
                    tracker.outcome.seconds = tracker.elapsed
                    return tracker.outcome
        except BusError:
            if retry == READ_RETRIES:
                raise
            await asyncio.sleep(0.5)
    tracker.outcome.seconds = tracker.elapsed
    return tracker.outcome
