"""Pause and resume: the exporter lets go of NVML for a GPU driver reload (after the queries
in flight), serves no GPU series meanwhile, confirms each command, and picks up again; a
restarted exporter stays paused until resumed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from gpuop.bus import InMemoryBus
from gpuop.events import device, driver
from gpuop.services.telemetry.node_exporter import NodeExporter
from gpuop.services.telemetry.sessions import SessionClosed
from gpuop_sim.nvml.modules import NVIDIA, InMemoryModules
from tests.support.node_agents import NODE, running, send_command, wait_for
from tests.support.telemetry import QUIET, CountingNvml, SlowFields, by_gpu
from tests.support.waiting import eventually

Exporters = Callable[..., NodeExporter]
GPU_PAUSE = device.PauseOperands(components=(driver.Component.GPU,), reason="upgrade")


async def test_pause_releases_nvml_and_is_confirmed_then_resume_reopens_it(
    bus: InMemoryBus,
    make_exporter: Exporters,
    modules: InMemoryModules,
    nvml: CountingNvml,
    registry: CollectorRegistry,
) -> None:
    exporter = make_exporter(QUIET.model_copy(update={"interval_seconds": 0.01}))
    async with running(exporter):
        await eventually(lambda: bool(exporter.exposition()))
        assert modules.holders(NVIDIA) == {"telemetry"}

        pause = await send_command(bus, GPU_PAUSE, id="pause-1")
        [(envelope, paused)] = await wait_for(bus, device.OperandPaused, 1)

        assert (paused.command_id, paused.service) == ("pause-1", device.OperandService.TELEMETRY)
        assert envelope.causationid == pause.id
        assert modules.holders(NVIDIA) == frozenset()
        assert exporter.paused
        assert exporter.exposition() == b""
        assert registry.get_sample_value("gpuop_telemetry_paused") == 1
        calls = sum(nvml.calls.values())
        await exporter.collect()
        with pytest.raises(SessionClosed):
            await exporter.collector.collect_slow()
        assert sum(nvml.calls.values()) == calls  # nothing touches NVML while paused

        await send_command(bus, device.ResumeOperands(reason="validated"), id="resume-1")
        [(_, resumed)] = await wait_for(bus, device.OperandResumed, 1)
        await eventually(lambda: len(by_gpu(exporter.exposition(), "DCGM_FI_DEV_GPU_TEMP")) == 8)

    assert resumed.command_id == "resume-1"
    assert registry.get_sample_value("gpuop_telemetry_paused") == 0
    assert nvml.calls["init"] == 2


async def test_a_pause_for_the_network_driver_only_is_confirmed_without_pausing(
    bus: InMemoryBus, make_exporter: Exporters, modules: InMemoryModules
) -> None:
    exporter = make_exporter()
    async with running(exporter):
        await eventually(lambda: bool(exporter.exposition()))

        await send_command(
            bus, device.PauseOperands(components=(driver.Component.OFED,)), id="pause-1"
        )
        await wait_for(bus, device.OperandPaused, 1)

        assert not exporter.paused
        assert modules.holders(NVIDIA) == {"telemetry"}
        assert exporter.exposition() != b""


async def test_a_restarted_exporter_stays_paused_until_resumed(
    bus: InMemoryBus, make_exporter: Exporters, modules: InMemoryModules
) -> None:
    async with running(make_exporter()):
        await send_command(bus, GPU_PAUSE, id="pause-1")
        await wait_for(bus, device.OperandPaused, 1)

    reports: list[tuple[bool, str]] = []
    restarted = make_exporter(
        readiness=lambda *report: reports.append(report), metrics=CollectorRegistry()
    )
    async with running(restarted):
        await eventually(lambda: bool(reports))
        assert reports == [(True, "")]  # paused is doing its job
        await restarted.collect()
        assert modules.holders(NVIDIA) == frozenset()
        assert restarted.exposition() == b""

        await send_command(bus, device.ResumeOperands(), id="resume-1")
        await eventually(lambda: bool(restarted.exposition()))
        assert modules.holders(NVIDIA) == {"telemetry"}


async def test_a_pause_waits_for_the_slow_queries_in_flight_before_closing_nvml(
    bus: InMemoryBus, nvml: CountingNvml, modules: InMemoryModules, registry: CollectorRegistry
) -> None:
    slow = SlowFields(nvml.inner)
    exporter = NodeExporter(bus, NODE, slow, QUIET, registry)
    async with running(exporter):
        await asyncio.to_thread(slow.entered.wait, 5)

        await send_command(bus, GPU_PAUSE, id="pause-1")
        await eventually(lambda: exporter.paused)
        assert modules.holders(NVIDIA) == {"telemetry"}  # the query still holds the GPUs

        slow.release.set()
        await wait_for(bus, device.OperandPaused, 1)
        assert modules.holders(NVIDIA) == frozenset()
