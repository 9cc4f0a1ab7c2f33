"""Operator metrics from the event stream: where the upgrade stands, cluster-wide.

`OperatorMetrics.observe` takes one event at a time, as `cluster_exporter` reads them, and
keeps these series on the service's registry:

- `gpuop_upgrade_nodes{state}`: nodes whose saga is in each `UpgradeState` now;
- `gpuop_upgrade_step_duration_seconds{step}`: how long nodes stayed in each state;
- `gpuop_upgrade_failures_total{step}`: sagas that went to upgrade-failed, by the state
  they failed in;
- `gpuop_driver_failures_total{step,reason}`: the driver-manager's failure results, by step
  and its reason vocabulary (the saga's own failure text is free-form, so it is no label);
- `gpuop_rollout_nodes{outcome}`, `gpuop_rollout_progress_ratio`, `gpuop_rollout_active`,
  `gpuop_rollout_info{rollout_id}`: the latest rollout's progress;
- `gpuop_rollouts_finished_total{outcome}`, `gpuop_rollout_duration_seconds`;
- `gpuop_gpus_unhealthy`, `gpuop_gpu_health_events_total{reason}`: GPU health across nodes;
- `gpuop_cluster_events_total{domain}`, `gpuop_cluster_dead_letters_total{kind,group}`:
  traffic on the bus as a whole (each process's own bus counters are `gpuop_bus_*`).

Gauges are rebuilt from the log at every start, so the reader replays history through
`observe(..., live=False)`, which moves gauges only; counters and histograms count what
happened while this process ran (`live=True`), so a restart never replays old failures
into `rate()`. Every label value comes from a closed vocabulary; node names never do.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpuop.events import REGISTRY, Command, Envelope, Event, Payload, driver, subjects
from gpuop.events.device import DeviceHealthChanged, HealthReason
from gpuop.events.upgrade import (
    TERMINAL_STATES,
    NodeUpgradeStateChanged,
    RolloutCompleted,
    RolloutEvent,
    RolloutFailed,
    RolloutFailureReason,
    RolloutProgress,
    RolloutStarted,
    UpgradeState,
)

STEP_SECONDS_BUCKETS: Final = (
    0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400,
)  # fmt: skip
"""From a cordon that takes a second to a drain that waits hours for a job."""
ROLLOUT_SECONDS_BUCKETS: Final = (60, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400, 172800)
OTHER = "other"
"""The label value of anything outside a closed vocabulary (a newer producer's domain)."""
DOMAINS: Final = frozenset(c.DOMAIN for c in REGISTRY.values() if issubclass(c, Event))
SERVICES: Final = frozenset(c.SERVICE for c in REGISTRY.values() if issubclass(c, Command))
OUTCOMES: Final = ("done", "failed", "pending")
FINISHES: Final = ("completed", *(reason.value for reason in RolloutFailureReason))
DRIVER_FAILURES: Final = {
    driver.DriverStep.UNLOAD.value: tuple(r.value for r in driver.UnloadFailureReason),
    driver.DriverStep.INSTALL.value: tuple(r.value for r in driver.InstallFailureReason),
    driver.DriverStep.LOAD.value: tuple(r.value for r in driver.LoadFailureReason),
    driver.DriverStep.VALIDATE.value: tuple(r.value for r in driver.LoadFailureReason),
    "rollback": tuple(step.value for step in driver.DriverStep),
}
"""Every (step, reason) of the driver-manager's failures, created at zero so that `rate()`
sees the first one."""


def _driver_failure(payload: driver.DriverFailure) -> tuple[str, str] | None:
    """The (step, reason) labels of a driver-manager failure."""
    if isinstance(payload, driver.DriverUnloadFailed):
        return driver.DriverStep.UNLOAD.value, payload.reason.value
    if isinstance(payload, driver.DriverInstallFailed):
        return driver.DriverStep.INSTALL.value, payload.reason.value
    if isinstance(payload, driver.DriverLoadFailed):
        return driver.DriverStep.LOAD.value, payload.reason.value
    if isinstance(payload, driver.DriverValidationFailed):
        return driver.DriverStep.VALIDATE.value, payload.reason.value
    if isinstance(payload, driver.DriverRollbackFailed):
        return "rollback", payload.failed_step.value
    return None


@dataclass(frozen=True, slots=True)
class _NodeState:
    state: UpgradeState
    since: datetime


class OperatorMetrics:
    """The cluster role's metrics; see the module docstring."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.nodes = Gauge(
            "gpuop_upgrade_nodes", "Nodes in each upgrade state.", ["state"], registry=registry
        )
        self.step_seconds = Histogram(
            "gpuop_upgrade_step_duration_seconds",
            "Time nodes spent in each upgrade state before leaving it.",
            ["step"],
            buckets=STEP_SECONDS_BUCKETS,
            registry=registry,
        )
        self.failures = Counter(
            "gpuop_upgrade_failures",
            "Node upgrades that failed, by the state they failed in.",
            ["step"],
            registry=registry,
        )
        self.driver_failures = Counter(
            "gpuop_driver_failures",
            "Driver-manager failures, by step and reason.",
            ["step", "reason"],
            registry=registry,
        )
        self.rollout_nodes = Gauge(
            "gpuop_rollout_nodes",
            "Nodes of the latest rollout: done, failed, or still pending.",
            ["outcome"],
            registry=registry,
        )
        self.rollout_progress = Gauge(
            "gpuop_rollout_progress_ratio",
            "Share of the latest rollout's nodes that finished (done or failed), 0 to 1.",
            registry=registry,
        )
        self.rollout_active = Gauge(
            "gpuop_rollout_active", "1 while a rollout runs.", registry=registry
        )
        self.rollout_info = Gauge(
            "gpuop_rollout_info",
            "1 for the latest rollout, labelled with its id.",
            ["rollout_id"],
            registry=registry,
        )
        self.rollouts_finished = Counter(
            "gpuop_rollouts_finished",
            "Rollouts that ended, by outcome (completed, or why they failed).",
            ["outcome"],
            registry=registry,
        )
        self.rollout_seconds = Histogram(
            "gpuop_rollout_duration_seconds",
            "Duration of completed rollouts.",
            buckets=ROLLOUT_SECONDS_BUCKETS,
            registry=registry,
        )
        self.unhealthy = Gauge(
            "gpuop_gpus_unhealthy",
            "GPUs whose last health event marked them unhealthy.",
            registry=registry,
        )
        self.health_events = Counter(
            "gpuop_gpu_health_events",
            "device.health-changed events, by reason.",
            ["reason"],
            registry=registry,
        )
        self.events = Counter(
            "gpuop_cluster_events",
            "Events published on the bus by any service, by domain.",
            ["domain"],
            registry=registry,
        )
        self.dead_letters = Counter(
            "gpuop_cluster_dead_letters",
            "Messages any consumer dead-lettered, by kind and domain or service.",
            ["kind", "group"],
            registry=registry,
        )
        for state in UpgradeState:
            self.nodes.labels(state=state.value)
            self.failures.labels(step=state.value)
            self.step_seconds.labels(step=state.value)
        for outcome in OUTCOMES:
            self.rollout_nodes.labels(outcome=outcome)
        for finish in FINISHES:
            self.rollouts_finished.labels(outcome=finish)
        for health in HealthReason:
            self.health_events.labels(reason=health.value)
        for domain in (*sorted(DOMAINS), OTHER):
            self.events.labels(domain=domain)
            self.dead_letters.labels(kind=subjects.Kind.EVENT.value, group=domain)
        for service in (*sorted(SERVICES), OTHER):
            self.dead_letters.labels(kind=subjects.Kind.COMMAND.value, group=service)
        self.dead_letters.labels(kind=OTHER, group=OTHER)
        for step, reasons in DRIVER_FAILURES.items():
            for cause in reasons:
                self.driver_failures.labels(step=step, reason=cause)
        self._states: dict[str, _NodeState] = {}
        self._unhealthy: set[tuple[str, str]] = set()
        self._rollout: str | None = None

    def observe(self, envelope: Envelope, payload: Payload, *, live: bool) -> None:
        """Take one event; `live` when it happened while this process ran."""
        if isinstance(payload, NodeUpgradeStateChanged):
            self._node_state(envelope, payload, live=live)
        elif isinstance(payload, RolloutEvent):
            self._rollout_event(payload, live=live)
        elif isinstance(payload, DeviceHealthChanged):
            self._health(envelope, payload, live=live)
        elif live and isinstance(payload, driver.DriverFailure):
            labels = _driver_failure(payload)
            if labels is not None:
                step, reason = labels
                self.driver_failures.labels(step=step, reason=reason).inc()

    def count_event(self, subject: str) -> None:
        """Count one event published on the bus, by its domain."""
        domain = subject.split(".")[2] if subject.count(".") >= 2 else OTHER
        self.events.labels(domain=domain if domain in DOMAINS else OTHER).inc()

    def count_dead_letter(self, subject: str, prefix: str) -> None:
        """Count one dead letter, by the kind and group of the subject it was sent on."""
        parts = subject.removeprefix(f"{prefix}.{subjects.Kind.DEAD_LETTER}.").split(".")
        kind = parts[1] if len(parts) > 2 else OTHER
        group = parts[2] if len(parts) > 2 else OTHER
        if kind == subjects.Kind.EVENT:
            group = group if group in DOMAINS else OTHER
        elif kind == subjects.Kind.COMMAND:
            group = group if group in SERVICES else OTHER
        else:
            kind, group = OTHER, OTHER
        self.dead_letters.labels(kind=kind, group=group).inc()

    def _node_state(
        self, envelope: Envelope, payload: NodeUpgradeStateChanged, *, live: bool
    ) -> None:
        node = envelope.node
        before = self._states.get(node)
        if before is not None:
            self.nodes.labels(state=before.state.value).dec()
            left_timely = payload.from_state is before.state and envelope.time >= before.since
            if live and left_timely and before.state not in TERMINAL_STATES:
                seconds = (envelope.time - before.since).total_seconds()
                self.step_seconds.labels(step=before.state.value).observe(seconds)
        self._states[node] = _NodeState(payload.to_state, envelope.time)
        self.nodes.labels(state=payload.to_state.value).inc()
        if live and payload.to_state is UpgradeState.UPGRADE_FAILED:
            failed_in = payload.from_state or payload.to_state
            self.failures.labels(step=failed_in.value).inc()

    def _rollout_event(self, payload: RolloutEvent, *, live: bool) -> None:
        if payload.rollout_id != self._rollout:
            if self._rollout is not None:
                self.rollout_info.remove(self._rollout)
            self._rollout = payload.rollout_id
            self.rollout_info.labels(rollout_id=payload.rollout_id).set(1)
        if isinstance(payload, RolloutStarted):
            self.rollout_active.set(1)
            self._progress(0, 0, payload.total)
        elif isinstance(payload, RolloutProgress):
            self._progress(payload.done, payload.failed, payload.total)
        elif isinstance(payload, RolloutCompleted | RolloutFailed):
            self.rollout_active.set(0)
            self._progress(payload.done, payload.failed, payload.total)
            if live and isinstance(payload, RolloutCompleted):
                self.rollouts_finished.labels(outcome="completed").inc()
                self.rollout_seconds.observe(payload.duration_seconds)
            elif live and isinstance(payload, RolloutFailed):
                self.rollouts_finished.labels(outcome=payload.reason.value).inc()

    def _progress(self, done: int, failed: int, total: int) -> None:
        self.rollout_nodes.labels(outcome="done").set(done)
        self.rollout_nodes.labels(outcome="failed").set(failed)
        self.rollout_nodes.labels(outcome="pending").set(max(total - done - failed, 0))
        self.rollout_progress.set((done + failed) / total if total else 0.0)

    def _health(self, envelope: Envelope, payload: DeviceHealthChanged, *, live: bool) -> None:
        key = (envelope.node, payload.gpu_uuid)
        if payload.healthy:
            self._unhealthy.discard(key)
        else:
            self._unhealthy.add(key)
        self.unhealthy.set(len(self._unhealthy))
        if live:
            self.health_events.labels(reason=payload.reason.value).inc()
