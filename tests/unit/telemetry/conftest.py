"""A simulated 8-GPU node for telemetry's node exporter, on the in-memory bus."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpuop.bus import InMemoryBus
from gpuop.services.telemetry.config import TelemetryConfig
from gpuop.services.telemetry.node_exporter import NodeExporter
from gpuop.services.telemetry.pods import PodResourcesSource
from gpuop_sim.nvml.modules import NVIDIA, InMemoryModules
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.node_agents import NODE
from tests.support.telemetry import QUIET, CountingNvml


@pytest.fixture
def modules() -> InMemoryModules:
    return InMemoryModules({NVIDIA: "580.159.04"})


@pytest.fixture
def sim(modules: InMemoryModules) -> SimNvml:
    return SimNvml(8, node=NODE, module_state=modules, holder_id="telemetry")


@pytest.fixture
def nvml(sim: SimNvml) -> CountingNvml:
    return CountingNvml(sim)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def make_exporter(
    bus: InMemoryBus, nvml: CountingNvml, registry: CollectorRegistry
) -> Callable[..., NodeExporter]:
    def make(
        config: TelemetryConfig = QUIET,
        pods: PodResourcesSource | None = None,
        readiness: Any = None,
        metrics: CollectorRegistry | None = None,
    ) -> NodeExporter:
        return NodeExporter(
            bus,
            NODE,
            nvml,
            config,
            metrics or registry,
            pod_resources=pods,
            readiness=readiness,
        )

    return make
