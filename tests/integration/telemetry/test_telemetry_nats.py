"""Telemetry on a real nats-server: an XID injected into a simulated node reaches the bus as
`device.health-changed` and `/metrics` as `DCGM_FI_DEV_XID_ERRORS`; a pause command over
NATS closes NVML and is confirmed; the cluster role turns upgrade events into metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpuop.bus import NatsBus, NatsServer
from gpuop.events import decode, device, driver, new_command, new_event, upgrade
from gpuop.events.upgrade import UpgradeState as S
from gpuop.runtime.settings import Role
from gpuop.services import telemetry
from gpuop.services.telemetry.config import TelemetryConfig
from gpuop.services.telemetry.node_exporter import NodeExporter
from gpuop_sim.nvml.modules import NVIDIA, InMemoryModules
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.services import connected, in_process
from tests.support.telemetry import by_gpu, scraping
from tests.support.waiting import eventually

NODE = "gpu-1.example.com"

pytestmark = pytest.mark.nats


async def stored(bus: NatsBus, subject: str) -> list[Any]:
    return [decode(message.data)[1] async for message in bus.read(subject)]


async def test_an_injected_xid_reaches_the_bus_and_the_scraped_metrics(
    nats_server: NatsServer,
) -> None:
    modules = InMemoryModules({NVIDIA: "580.159.04"})
    sim = SimNvml(8, node=NODE, module_state=modules, holder_id="telemetry")
    registry = CollectorRegistry()
    config = TelemetryConfig(interval_seconds=0.2, labels=("gpu", "UUID", "Hostname"))
    stopping = asyncio.Event()
    async with connected(nats_server, "telemetry-node") as bus:
        exporter = NodeExporter(bus, NODE, sim, config, registry)
        async with scraping(registry, exporter) as scrape:
            task = asyncio.create_task(exporter.run(stopping))
            try:
                await eventually(
                    lambda: _has(scrape, lambda t: len(by_gpu(t, "DCGM_FI_DEV_GPU_TEMP")) == 8)
                )
                sim.inject_xid(6, 79)
                health = f"{bus.prefix}.evt.device.*.health-changed"

                async def published() -> bool:
                    return len(await stored(bus, health)) == 1

                await eventually(published)
                await eventually(
                    lambda: _has(
                        scrape, lambda t: by_gpu(t, "DCGM_FI_DEV_XID_ERRORS").get("6") == 79
                    )
                )

                pause = device.PauseOperands(components=(driver.Component.GPU,))
                await bus.publish(new_command(pause, node=NODE, source="/gpuop/test", id="p-1"))
                paused = f"{bus.prefix}.evt.device.*.operand-paused"

                async def confirmed() -> bool:
                    return len(await stored(bus, paused)) == 1

                await eventually(confirmed)
                assert modules.holders(NVIDIA) == frozenset()
                assert b"DCGM_FI_DEV_GPU_TEMP" not in await scrape()
            finally:
                stopping.set()
                await asyncio.wait_for(task, 10)

    [event] = await _read_once(nats_server, health)
    assert isinstance(event, device.DeviceHealthChanged)
    assert (event.healthy, event.reason, event.xid) == (False, device.HealthReason.XID, 79)


async def _has(scrape: Callable[[], Awaitable[bytes]], check: Callable[[bytes], bool]) -> bool:
    return check(await scrape())


async def _read_once(nats: NatsServer, subject: str) -> list[Any]:
    async with connected(nats, "reader") as bus:
        return await stored(bus, subject)


async def test_the_cluster_role_turns_upgrade_events_into_metrics(
    nats_server: NatsServer,
) -> None:
    def moved(before: S | None, after: S) -> upgrade.NodeUpgradeStateChanged:
        return upgrade.NodeUpgradeStateChanged(
            rollout_id="rollout-1",
            from_state=before,
            to_state=after,
            components=(driver.Component.GPU,),
            target_versions={driver.Component.GPU: "580.159.04"},
        )

    async with connected(nats_server, "orchestrator") as orchestrator:
        await orchestrator.publish(
            new_event(moved(None, S.UPGRADE_REQUIRED), node=NODE, source="/gpuop/test")
        )
        async with in_process(telemetry.SERVICE, nats_server, role=Role.CLUSTER) as context:

            async def nodes(state: S) -> float:
                found = context.registry.get_sample_value(
                    "gpuop_upgrade_nodes", {"state": state.value}
                )
                return found or 0.0

            async def replayed() -> bool:
                return context.ready and await nodes(S.UPGRADE_REQUIRED) == 1

            await eventually(replayed)
            await orchestrator.publish(
                new_event(
                    moved(S.UPGRADE_REQUIRED, S.UPGRADE_FAILED), node=NODE, source="/gpuop/test"
                )
            )

            async def failed() -> bool:
                return await nodes(S.UPGRADE_FAILED) == 1

            await eventually(failed)
            assert await nodes(S.UPGRADE_REQUIRED) == 0
            assert (
                context.registry.get_sample_value(
                    "gpuop_upgrade_failures_total", {"step": "upgrade-required"}
                )
                == 1
            )
