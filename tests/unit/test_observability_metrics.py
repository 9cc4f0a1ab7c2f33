"""The process registry and the bus's counters."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpuop.events import subjects
from gpuop.observability import metrics


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_published_counts_each_kind(registry):
    bus = metrics.BusMetrics(registry)
    bus.published("evt")
    bus.published(subjects.Kind.EVENT)
    bus.published(subjects.Kind.DEAD_LETTER)
    assert value(registry, "gpuop_bus_published_total", kind="evt") == 2
    assert value(registry, "gpuop_bus_published_total", kind="dlq") == 1
    assert value(registry, "gpuop_bus_published_total", kind="cmd") == 0


def test_consumer_counters_increase(registry):
    bus = metrics.BusMetrics(registry)
    bus.consumed("driver-manager", "acked")
    bus.consumed("driver-manager", "acked")
    bus.consumed("driver-manager", "dead_lettered")
    bus.dead_lettered("driver-manager", "max_deliver")
    bus.redelivered("driver-manager")
    bus.unknown_type("telemetry")
    labels = {"consumer": "driver-manager"}
    assert value(registry, "gpuop_bus_consumed_total", outcome="acked", **labels) == 2
    assert value(registry, "gpuop_bus_consumed_total", outcome="dead_lettered", **labels) == 1
    assert value(registry, "gpuop_bus_dead_lettered_total", reason="max_deliver", **labels) == 1
    assert value(registry, "gpuop_bus_redelivered_total", **labels) == 1
    assert value(registry, "gpuop_bus_unknown_types_total", consumer="telemetry") == 1


def test_handler_durations_land_in_the_histogram(registry):
    bus = metrics.BusMetrics(registry)
    bus.observe_handler("discovery", 0.003)
    bus.observe_handler("discovery", 45.0)
    labels = {"consumer": "discovery"}
    assert value(registry, "gpuop_bus_handler_seconds_count", **labels) == 2
    assert value(registry, "gpuop_bus_handler_seconds_sum", **labels) == pytest.approx(45.003)
    assert value(registry, "gpuop_bus_handler_seconds_bucket", le="0.005", **labels) == 1
    assert value(registry, "gpuop_bus_handler_seconds_bucket", le="60.0", **labels) == 2


def test_two_instances_on_one_registry_share_the_series(registry):
    first, second = metrics.BusMetrics(registry), metrics.BusMetrics(registry)
    first.published("cmd")
    second.published("cmd")
    assert value(registry, "gpuop_bus_published_total", kind="cmd") == 2


def test_separate_registries_keep_separate_counts(registry):
    other = CollectorRegistry()
    metrics.BusMetrics(registry).published("evt")
    assert value(other, "gpuop_bus_published_total", kind="evt") is None
    metrics.BusMetrics(other)
    assert value(other, "gpuop_bus_published_total", kind="evt") == 0


def test_declare_consumer_exposes_every_series_at_zero(registry):
    metrics.BusMetrics(registry).declare_consumer("network-manager")
    labels = {"consumer": "network-manager"}
    for outcome in metrics.CONSUME_OUTCOMES:
        assert value(registry, "gpuop_bus_consumed_total", outcome=outcome, **labels) == 0
    for reason in metrics.DEAD_LETTER_REASONS:
        assert value(registry, "gpuop_bus_dead_lettered_total", reason=reason, **labels) == 0
    assert value(registry, "gpuop_bus_redelivered_total", **labels) == 0
    assert value(registry, "gpuop_bus_unknown_types_total", **labels) == 0
    assert value(registry, "gpuop_bus_handler_seconds_count", **labels) == 0


def test_label_values_outside_the_vocabulary_are_refused(registry):
    bus = metrics.BusMetrics(registry)
    unbounded: Any = "gpuop.evt.driver.gpu-node-1.loaded"
    with pytest.raises(ValueError, match="evt, cmd, dlq"):
        bus.published(unbounded)
    with pytest.raises(ValueError, match="acked"):
        bus.consumed("driver-manager", unbounded)
    with pytest.raises(ValueError, match="malformed"):
        bus.dead_lettered("driver-manager", unbounded)


def test_exposition_uses_the_documented_names(registry):
    bus = metrics.BusMetrics(registry)
    bus.published("evt")
    text = generate_latest(registry).decode()
    assert 'gpuop_bus_published_total{kind="evt"} 1.0' in text
    assert "# TYPE gpuop_bus_handler_seconds histogram" in text


def test_process_registry_is_one_object_with_process_metrics():
    assert metrics.registry() is metrics.registry()
    assert b"python_info" in generate_latest(metrics.registry())
