"""One node's driver upgrade is one trace across the services.

Everything runs in this process on the in-memory bus, with the spans kept in memory: the
upgrade orchestrator's runtime (runner, outbox, deadlines, intake; a fake Kubernetes that
succeeds every action), and on one simulated H200 node sharing one host root the real
driver-manager agent (simulated kernel, a driver source with the new version), the device
plugin with the simulated kubelet, telemetry's node exporter and discovery's node agent.
The device plugin, telemetry and discovery hold NVML until the pause, so the unload only
succeeds because they let go. Then the spans must form one tree, rooted at the saga's span,
with the orchestrator's steps, the driver-manager's and every operand's command handling in
it, and every agent's answer decided under the handling that produced it. With tracing off
the same upgrade goes through and nothing carries a trace.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuop.bus import Buckets, InMemoryBus
from gpuop.events import decode, subjects
from gpuop.events import device as dev
from gpuop.events import driver as dm
from gpuop.events.driver import Component
from gpuop.events.upgrade import UpgradeState
from gpuop.host import packaging, system
from gpuop.host.roots import HostRoot
from gpuop.nvml import open_backend
from gpuop.observability import tracing
from gpuop.policy import ComponentSpec, DriverSpec, GPUClusterPolicySpec
from gpuop.runtime.settings import Settings
from gpuop.saga import NodeSaga, NodeStatus, new_saga
from gpuop.services.discovery.config import DiscoveryConfig
from gpuop.services.discovery.node_agent import NodeAgent as DiscoveryAgent
from gpuop.services.driver_manager import agent as driver_agent
from gpuop.services.driver_manager.config import DriverManagerConfig
from gpuop.services.driver_manager.state import StateStore
from gpuop.services.telemetry.config import TelemetryConfig
from gpuop.services.telemetry.node_exporter import NodeExporter
from gpuop.services.upgrade_orchestrator import intake, traces
from gpuop.services.upgrade_orchestrator.acting import Outbox
from gpuop.services.upgrade_orchestrator.deadlines import DeadlineScheduler
from gpuop.services.upgrade_orchestrator.running import Runner
from gpuop.services.upgrade_orchestrator.store import SagaStore
from gpuop_sim.cluster import hosts
from gpuop_sim.host import keys, seeding
from tests.support.driver_manager import TRUSTED
from tests.support.kubelet_plugin import NODE, running_node
from tests.support.orchestrator import FakeKube
from tests.support.spans import ancestry, named, one_tree, recorded_spans, untraced

GPUS = 2
OLD = seeding.RECORDED_DRIVER_VERSION
NEW = "580.200.01"
BOOT_ID = "8c1f2f5e-0c53-4d57-a0a4-3e3c1b0c9a11"
UPGRADE_TIMEOUT = 30.0
OPERANDS = tuple(dev.OperandService)
SERVICES = {
    "gpuop.services.upgrade_orchestrator.traces",
    "gpuop.services.driver_manager.agent",
    "gpuop.services.device_plugin.agent",
    "gpuop.services.telemetry.node_exporter",
    "gpuop.services.discovery.node_agent",
}
"""The instrumentation scope of each service's spans (one process here, so one resource)."""


@dataclass
class Cluster:
    """The orchestrator's runtime and one node's services, on one bus."""

    bus: InMemoryBus
    store: SagaStore
    outbox: Outbox
    runner: Runner
    saga: NodeSaga

    async def upgrade(self) -> None:
        """Admit the node and wait until its saga is done and every operand resumed."""
        await self.store.create(self.saga)
        await self.runner.admit({NODE: NodeStatus()})
        async with asyncio.timeout(UPGRADE_TIMEOUT):
            while (stored := await self.store.get(NODE)) is None or (
                stored.saga.state is not UpgradeState.UPGRADE_DONE
            ):
                assert stored is None or stored.saga.state is not UpgradeState.UPGRADE_FAILED, (
                    stored.saga.last_error
                )
                await asyncio.sleep(0.02)
            while len(await self.resumed()) < len(OPERANDS):
                await asyncio.sleep(0.02)
        await self.outbox.idle()

    async def resumed(self) -> set[str]:
        found = set()
        async for stored in self.bus.read(f"{self.bus.prefix}.evt.device.>"):
            payload = decode(stored.data)[1]
            if isinstance(payload, dev.OperandResumed):
                found.add(str(payload.service))
        return found


@pytest.fixture
def host(tmp_path: Path) -> HostRoot:
    return hosts.build_host_root(tmp_path / "host", NODE, GPUS, boot_id=BOOT_ID)


@pytest.fixture
def source(tmp_path: Path, host: HostRoot) -> Path:
    kernel = system.kernel_release(host)
    assert kernel is not None
    packaging.build_driver_source(
        tmp_path / "source", [("gpu", NEW, kernel)], signing_key=keys.SIGNING_KEY
    )
    return tmp_path / "source"


@asynccontextmanager
async def cluster(bus: InMemoryBus, host: HostRoot, source: Path) -> AsyncIterator[Cluster]:
    """Every service of the upgrade running until the block ends."""
    spec = GPUClusterPolicySpec(
        driver=DriverSpec(
            gpu=ComponentSpec(version=NEW, source=str(source), public_keys=(keys.PUBLIC_KEY,))
        )
    )
    nvml = f"sim:{GPUS}"
    async with AsyncExitStack() as running:
        stopping = asyncio.Event()
        # the node's agents
        config = DriverManagerConfig(trust=TRUSTED)
        settings = Settings(service=dm.SERVICE, node=NODE, host_root=host.path, nvml=nvml)
        executor = driver_agent.build_executor(settings, config)
        manager = driver_agent.CommandAgent(
            bus, NODE, executor, StateStore(host), CollectorRegistry()
        )
        commands = await bus.consume(manager.consumer_spec(config), manager.handle)
        running.push_async_callback(commands.stop)
        await running.enter_async_context(running_node(host, gpus=GPUS, bus=bus))
        exporter = NodeExporter(
            bus,
            NODE,
            open_backend(nvml, host_root=host.path, node=NODE, holder_id="telemetry"),
            TelemetryConfig(interval_seconds=3600, slow_interval_seconds=3600),
            CollectorRegistry(),
        )
        discovery = DiscoveryAgent(
            bus,
            NODE,
            host,
            open_backend(nvml, host_root=host.path, node=NODE, holder_id="discovery"),
            DiscoveryConfig(scan_interval_seconds=3600, heartbeat_interval_seconds=3600),
        )
        for agent in (exporter, discovery):
            task = asyncio.create_task(agent.run(stopping))
            running.push_async_callback(asyncio.wait_for, task, 10)
        running.callback(stopping.set)  # on the way out: before the runs above are awaited
        # the orchestrator
        store = SagaStore(await bus.kv(Buckets.SAGAS))
        outbox = Outbox(bus, FakeKube())
        deadlines = DeadlineScheduler(bus)
        running.push_async_callback(outbox.close)
        running.push_async_callback(deadlines.close)
        runner = Runner(bus, store, outbox, deadlines, lambda: spec)
        consumer = await intake.start(bus, runner)
        running.push_async_callback(consumer.stop)
        saga = new_saga(
            node=NODE,
            rollout_id="rollout-1",
            policy=spec,
            running={Component.GPU: OLD},
            now=datetime.now(UTC),
            boot_id=BOOT_ID,
            operands=OPERANDS,
        )
        yield Cluster(bus, store, outbox, runner, saga)


async def test_one_node_upgrade_is_one_trace_across_the_services(
    bus: InMemoryBus, host: HostRoot, source: Path
) -> None:
    with recorded_spans("gpuop-in-one-process") as exporter:
        async with cluster(bus, host, source) as running:
            await running.upgrade()
        found = exporter.get_finished_spans()
    saga = running.saga

    root = one_tree(found)
    assert root.name == traces.ROOT
    assert root.context.trace_id == traces.trace_id(saga.saga_id, 1)
    assert {span.instrumentation_scope.name for span in found} >= SERVICES
    [unload] = named(found, "handle unload")
    assert unload.instrumentation_scope.name == "gpuop.services.driver_manager.agent"
    assert ancestry(unload, found) == ["handle unload", "step unload-gpu", traces.ROOT]
    [unloaded] = named(found, "decide driver.unloaded")
    assert ancestry(unloaded, found)[:2] == ["decide driver.unloaded", "handle unload"]
    pauses = named(found, "handle pause")
    assert {span.instrumentation_scope.name for span in pauses} == {
        "gpuop.services.device_plugin.agent",
        "gpuop.services.telemetry.node_exporter",
        "gpuop.services.discovery.node_agent",
    }
    assert all(ancestry(p, found)[1:] == ["step operands-pause", traces.ROOT] for p in pauses)
    decided = named(found, "decide device.operand-paused")
    assert {ancestry(d, found)[1] for d in decided} <= {"handle pause"}
    plugin_pause = next(p for p in pauses if p.instrumentation_scope.name.endswith("plugin.agent"))
    answered = {d.parent.span_id for d in decided if d.parent is not None}
    assert plugin_pause.context.span_id in answered, "the plugin's answer was decided in it"
    for verb, step in (
        ("install", "install-gpu"),
        ("load", "load-gpu"),
    ):
        [handled] = named(found, f"handle {verb}")
        assert ancestry(handled, found)[1] == f"step {step}"
    # the validation ladder's driver rungs: the NVML check and the CUDA probe
    validated = named(found, "handle validate")
    assert sorted(ancestry(v, found)[1] for v in validated) == [
        "step validate-cuda-gpu",
        "step validate-gpu",
    ]


async def test_with_tracing_off_the_upgrade_goes_through_and_nothing_carries_a_trace(
    bus: InMemoryBus, host: HostRoot, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.build_tracer_provider("upgrade-orchestrator") is None
    with untraced():  # what configure_tracing installs then: nothing
        async with cluster(bus, host, source) as running:
            await running.upgrade()
    messages = [
        decode(stored.data)[0]
        async for stored in bus.read(
            subjects.stream_filter(subjects.Kind.COMMAND, prefix=bus.prefix)
        )
    ]
    assert messages and all(envelope.traceparent is None for envelope in messages)
