"""The cluster role's metrics from the event stream: nodes per state, step durations,
failures by step and reason, rollout progress, GPU health and bus traffic; history moves the
gauges only, so a restart never replays old failures into the counters."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from gpuop.bus import InMemoryBus
from gpuop.events import Envelope, Event, decode, device, driver, new_event, subjects, upgrade
from gpuop.events.upgrade import UpgradeState as S
from gpuop.services.telemetry.cluster_exporter import ClusterExporter
from gpuop.services.telemetry.config import TelemetryConfig
from gpuop.services.telemetry.operator_metrics import OperatorMetrics
from tests.support.waiting import eventually

ROLLOUT = "rollout-580.159.04"
GPU = driver.Component.GPU
UUID = "GPU-20bce083-dbf9-2d4f-3c35-c858915accc5"
T0 = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)


def moved(node: str, before: S | None, after: S, at: float) -> Envelope:
    change = upgrade.NodeUpgradeStateChanged(
        rollout_id=ROLLOUT,
        from_state=before,
        to_state=after,
        components=(GPU,),
        target_versions={GPU: "580.159.04"},
    )
    return event(change, node, at)


def event(payload: Event, node: str, at: float = 0.0) -> Envelope:
    return new_event(payload, node=node, source="/gpuop/test", now=T0 + timedelta(seconds=at))


def feed(metrics: OperatorMetrics, *envelopes: Envelope, live: bool = True) -> None:
    for envelope in envelopes:
        _, payload = decode(envelope.to_bytes())
        metrics.observe(envelope, payload, live=live)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_nodes_per_state_follow_each_nodes_last_transition(registry: CollectorRegistry) -> None:
    metrics = OperatorMetrics(registry)

    feed(
        metrics,
        moved("gpu-1", None, S.UPGRADE_REQUIRED, 0),
        moved("gpu-2", None, S.UPGRADE_REQUIRED, 0),
        moved("gpu-1", S.UPGRADE_REQUIRED, S.CORDON_REQUIRED, 5),
        moved("gpu-1", S.CORDON_REQUIRED, S.WAIT_FOR_JOBS_REQUIRED, 6),
    )

    assert value(registry, "gpuop_upgrade_nodes", state="upgrade-required") == 1
    assert value(registry, "gpuop_upgrade_nodes", state="wait-for-jobs-required") == 1
    assert value(registry, "gpuop_upgrade_nodes", state="cordon-required") == 0
    assert value(registry, "gpuop_upgrade_nodes", state="upgrade-done") == 0


def test_step_durations_are_the_time_between_a_nodes_transitions(
    registry: CollectorRegistry,
) -> None:
    metrics = OperatorMetrics(registry)

    feed(
        metrics,
        moved("gpu-1", None, S.DRAIN_REQUIRED, 0),
        moved("gpu-1", S.DRAIN_REQUIRED, S.OPERANDS_PAUSE_REQUIRED, 42),
        moved("gpu-1", S.OPERANDS_PAUSE_REQUIRED, S.DRIVER_RELOAD_REQUIRED, 43.5),
        moved("gpu-1", S.DRIVER_RELOAD_REQUIRED, S.UPGRADE_DONE, 100),
        moved("gpu-1", S.UPGRADE_DONE, S.UPGRADE_REQUIRED, 5000),  # a new rollout
    )

    step = "gpuop_upgrade_step_duration_seconds"
    assert value(registry, f"{step}_sum", step="drain-required") == 42
    assert value(registry, f"{step}_sum", step="operands-pause-required") == 1.5
    assert value(registry, f"{step}_count", step="driver-reload-required") == 1
    assert value(registry, f"{step}_count", step="upgrade-done") == 0  # not a step


def test_a_missed_transition_observes_no_duration(registry: CollectorRegistry) -> None:
    metrics = OperatorMetrics(registry)

    feed(
        metrics,
        moved("gpu-1", None, S.CORDON_REQUIRED, 0),
        moved("gpu-1", S.DRAIN_REQUIRED, S.OPERANDS_PAUSE_REQUIRED, 50),
    )

    step = "gpuop_upgrade_step_duration_seconds_count"
    assert value(registry, step, step="cordon-required") == 0
    assert value(registry, step, step="drain-required") == 0


def test_failures_count_by_step_and_driver_failures_by_reason(registry: CollectorRegistry) -> None:
    metrics = OperatorMetrics(registry)

    feed(
        metrics,
        moved("gpu-1", None, S.DRAIN_REQUIRED, 0),
        moved("gpu-1", S.DRAIN_REQUIRED, S.UPGRADE_FAILED, 10),
        event(
            driver.DriverUnloadFailed(
                command_id="c1", component=GPU, reason=driver.UnloadFailureReason.IN_USE
            ),
            "gpu-2",
        ),
        event(
            driver.DriverInstallFailed(
                command_id="c2",
                component=GPU,
                version="580.159.04",
                reason=driver.InstallFailureReason.VERIFICATION_FAILED,
            ),
            "gpu-3",
        ),
        event(
            driver.DriverRollbackFailed(
                command_id="c3",
                component=GPU,
                version="570.1",
                failed_step=driver.DriverStep.LOAD,
            ),
            "gpu-4",
        ),
    )

    assert value(registry, "gpuop_upgrade_failures_total", step="drain-required") == 1
    failures = "gpuop_driver_failures_total"
    assert value(registry, failures, step="unload", reason="in-use") == 1
    assert value(registry, failures, step="install", reason="verification-failed") == 1
    assert value(registry, failures, step="rollback", reason="load") == 1


def test_rollout_progress_tracks_the_latest_rollout(registry: CollectorRegistry) -> None:
    metrics = OperatorMetrics(registry)
    started = upgrade.RolloutStarted(
        rollout_id=ROLLOUT,
        trigger=upgrade.RolloutTrigger.POLICY,
        target_versions={GPU: "580.159.04"},
        total=8,
        max_parallel_upgrades=2,
        max_unavailable="25%",
    )
    progress = upgrade.RolloutProgress(
        rollout_id=ROLLOUT, done=3, failed=1, total=8, counts={S.UPGRADE_DONE: 3}
    )
    completed = upgrade.RolloutCompleted(
        rollout_id=ROLLOUT, done=7, failed=1, total=8, duration_seconds=900
    )

    feed(metrics, event(started, subjects.CLUSTER), event(progress, subjects.CLUSTER))

    assert value(registry, "gpuop_rollout_active") == 1
    assert value(registry, "gpuop_rollout_progress_ratio") == 0.5
    assert value(registry, "gpuop_rollout_nodes", outcome="pending") == 4
    assert value(registry, "gpuop_rollout_info", rollout_id=ROLLOUT) == 1

    feed(metrics, event(completed, subjects.CLUSTER))

    assert value(registry, "gpuop_rollout_active") == 0
    assert value(registry, "gpuop_rollout_progress_ratio") == 1
    assert value(registry, "gpuop_rollouts_finished_total", outcome="completed") == 1
    assert value(registry, "gpuop_rollout_duration_seconds_sum") == 900

    feed(metrics, event(started.model_copy(update={"rollout_id": "next"}), subjects.CLUSTER))
    assert registry.get_sample_value("gpuop_rollout_info", {"rollout_id": ROLLOUT}) is None
    assert value(registry, "gpuop_rollout_info", rollout_id="next") == 1


def test_unhealthy_gpus_are_counted_until_they_recover(registry: CollectorRegistry) -> None:
    metrics = OperatorMetrics(registry)
    sick = device.DeviceHealthChanged(
        gpu_uuid=UUID, healthy=False, reason=device.HealthReason.XID, xid=79
    )
    well = device.DeviceHealthChanged(
        gpu_uuid=UUID, healthy=True, reason=device.HealthReason.RECOVERED
    )

    feed(metrics, event(sick, "gpu-1"), event(sick, "gpu-2"), event(sick, "gpu-1"))
    assert value(registry, "gpuop_gpus_unhealthy") == 2
    feed(metrics, event(well, "gpu-1"))

    assert value(registry, "gpuop_gpus_unhealthy") == 1
    assert value(registry, "gpuop_gpu_health_events_total", reason="xid") == 3


def test_history_moves_the_gauges_but_not_the_counters(registry: CollectorRegistry) -> None:
    metrics = OperatorMetrics(registry)

    feed(
        metrics,
        moved("gpu-1", None, S.DRAIN_REQUIRED, 0),
        moved("gpu-1", S.DRAIN_REQUIRED, S.UPGRADE_FAILED, 10),
        live=False,
    )

    assert value(registry, "gpuop_upgrade_nodes", state="upgrade-failed") == 1
    assert value(registry, "gpuop_upgrade_failures_total", step="drain-required") == 0
    step = "gpuop_upgrade_step_duration_seconds_count"
    assert value(registry, step, step="drain-required") == 0


def test_bus_traffic_counts_by_domain_and_dead_letters_by_kind(
    registry: CollectorRegistry,
) -> None:
    metrics = OperatorMetrics(registry)

    metrics.count_event("gpuop.evt.driver.gpu-1.loaded")
    metrics.count_event("gpuop.evt.driver.gpu-2.loaded")
    metrics.count_event("gpuop.evt.brand-new.gpu-1.thing")
    metrics.count_dead_letter("gpuop.dlq.gpuop.cmd.driver-manager.gpu-1.unload", "gpuop")
    metrics.count_dead_letter("gpuop.dlq.gpuop.evt.nonsense.gpu-1.x", "gpuop")
    metrics.count_dead_letter("gpuop.dlq.garbage", "gpuop")

    assert value(registry, "gpuop_cluster_events_total", domain="driver") == 2
    assert value(registry, "gpuop_cluster_events_total", domain="other") == 1
    letters = "gpuop_cluster_dead_letters_total"
    assert value(registry, letters, kind="cmd", group="driver-manager") == 1
    assert value(registry, letters, kind="evt", group="other") == 1
    assert value(registry, letters, kind="other", group="other") == 1


async def test_the_cluster_exporter_replays_history_then_counts_what_happens_live(
    bus: InMemoryBus, registry: CollectorRegistry
) -> None:
    await bus.publish(moved("gpu-1", None, S.DRAIN_REQUIRED, 0))
    await bus.publish(moved("gpu-1", S.DRAIN_REQUIRED, S.UPGRADE_FAILED, 10))
    await bus.publish(moved("gpu-2", None, S.UPGRADE_REQUIRED, 0))
    reports: list[tuple[bool, str]] = []
    exporter = ClusterExporter(
        bus, registry, TelemetryConfig(), readiness=lambda *report: reports.append(report)
    )
    stopping = asyncio.Event()
    task = asyncio.create_task(exporter.run(stopping))
    try:
        await eventually(lambda: bool(reports))
        assert value(registry, "gpuop_upgrade_nodes", state="upgrade-failed") == 1
        assert value(registry, "gpuop_upgrade_failures_total", step="drain-required") == 0

        await bus.publish(moved("gpu-2", S.UPGRADE_REQUIRED, S.UPGRADE_FAILED, 20))
        unload = driver.DriverUnloadFailed(
            command_id="c1", component=GPU, reason=driver.UnloadFailureReason.TIMEOUT
        )
        await bus.publish(event(unload, "gpu-2"))

        await eventually(
            lambda: value(registry, "gpuop_upgrade_failures_total", step="upgrade-required") == 1
        )
        await eventually(
            lambda: (
                value(registry, "gpuop_driver_failures_total", step="unload", reason="timeout") == 1
            )
        )
        assert value(registry, "gpuop_upgrade_nodes", state="upgrade-failed") == 2
        assert value(registry, "gpuop_upgrade_nodes", state="upgrade-required") == 0
        await eventually(
            lambda: value(registry, "gpuop_cluster_events_total", domain="driver") == 1
        )
        assert value(registry, "gpuop_cluster_events_total", domain="upgrade") == 1  # live only
    finally:
        stopping.set()
        await asyncio.wait_for(task, 5)
    assert reports == [(True, "")]
