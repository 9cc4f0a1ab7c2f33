"""Discovery's node role on the in-memory bus: publish on change only, heartbeats, rescans on
command and after driver changes, pause and resume of NVML use, restarts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from gpuop.bus import Buckets, Delivery, InMemoryBus
from gpuop.events import device, driver, hardware, mig_commands, new_event, subjects
from gpuop.host.roots import HostRoot
from gpuop.services.discovery.config import DiscoveryConfig
from gpuop.services.discovery.node_agent import NodeAgent
from gpuop_sim.host.simkernel import SimKernel
from tests.support.node_agents import NODE, published, running, send_command, send_event, wait_for
from tests.unit.discovery.support import BOOT_ID, QUIET, CountingNvml

Agents = Callable[..., NodeAgent]
Discovered = hardware.HardwareDiscovered


def unload_gpu_driver(host: HostRoot) -> None:
    kernel = SimKernel(host)
    kernel.rmmod("nvidia_uvm")
    kernel.rmmod("nvidia")


async def test_the_first_scan_publishes_stores_and_makes_the_agent_ready(
    bus: InMemoryBus, make_agent: Agents
) -> None:
    reports: list[tuple[bool, str]] = []
    agent = make_agent(readiness=lambda ready, reason: reports.append((ready, reason)))

    inventory = await agent.scan()

    [(envelope, event)] = await published(bus, Discovered)
    assert event == inventory
    assert len(event.gpus) == 2
    assert envelope.node == NODE
    assert envelope.source == f"/gpuop/discovery/{NODE}"
    stored = await (await bus.kv(Buckets.NODES)).get(subjects.encode_node(NODE))
    assert stored is not None
    assert Discovered.model_validate_json(stored.value) == inventory
    assert reports == [(True, "")]


async def test_an_unchanged_inventory_is_not_published_again(
    bus: InMemoryBus, make_agent: Agents
) -> None:
    agent = make_agent()

    await agent.scan()
    await agent.scan()
    await agent.scan()

    assert len(await published(bus, Discovered)) == 1


async def test_a_changed_inventory_is_published(
    bus: InMemoryBus, make_agent: Agents, host: HostRoot
) -> None:
    agent = make_agent()
    await agent.scan()

    unload_gpu_driver(host)
    await agent.scan()

    [(_, before), (_, after)] = await published(bus, Discovered)
    assert len(before.gpus) == 2
    assert after.gpus == ()
    assert after.driver_version is None
    assert before.inventory_hash != after.inventory_hash


async def test_a_restarted_agent_does_not_republish_an_unchanged_inventory(
    bus: InMemoryBus, make_agent: Agents
) -> None:
    await make_agent().scan()

    restarted = make_agent()
    await restarted.restore()
    await restarted.scan()

    assert len(await published(bus, Discovered)) == 1
    assert restarted.published is not None


async def test_the_heartbeat_carries_the_last_hash_the_boot_id_and_the_gpu_count(
    bus: InMemoryBus, make_agent: Agents, host: HostRoot
) -> None:
    agent = make_agent()
    assert await agent.heartbeat() is None
    inventory = await agent.scan()
    (host.path / "proc/uptime").write_text("1234.50 4000.00\n")

    beat = await agent.heartbeat()

    [(_, event)] = await published(bus, hardware.HardwareHeartbeat)
    assert event == beat
    assert event.inventory_hash == inventory.inventory_hash
    assert event.boot_id == BOOT_ID
    assert event.gpu_count == 2
    assert event.uptime_seconds == 1234.5


async def test_heartbeats_repeat_on_their_interval(bus: InMemoryBus, make_agent: Agents) -> None:
    config = DiscoveryConfig(scan_interval_seconds=3600, heartbeat_interval_seconds=0.02)
    agent = make_agent(config)

    async with running(agent):
        await wait_for(bus, hardware.HardwareHeartbeat, 3)

    assert len(await published(bus, Discovered)) == 1


async def test_periodic_scans_notice_a_change_by_themselves(
    bus: InMemoryBus, make_agent: Agents, host: HostRoot
) -> None:
    config = DiscoveryConfig(scan_interval_seconds=0.02, heartbeat_interval_seconds=3600)
    agent = make_agent(config)

    async with running(agent):
        await wait_for(bus, Discovered, 1)
        unload_gpu_driver(host)
        [_, (_, after)] = await wait_for(bus, Discovered, 2)

    assert after.gpus == ()


async def test_a_reboot_seen_by_the_heartbeat_is_scanned_at_once(
    bus: InMemoryBus, make_agent: Agents, host: HostRoot
) -> None:
    config = DiscoveryConfig(scan_interval_seconds=3600, heartbeat_interval_seconds=0.02)
    agent = make_agent(config)

    async with running(agent):
        await wait_for(bus, Discovered, 1)
        new_boot_id = SimKernel(host).reboot(load=("nvidia",))
        [_, (_, after)] = await wait_for(bus, Discovered, 2)

    assert after.boot_id == new_boot_id


async def test_a_rescan_command_publishes_even_an_unchanged_inventory(
    bus: InMemoryBus, make_agent: Agents
) -> None:
    async with running(make_agent()):
        await wait_for(bus, Discovered, 1)
        command = await send_command(bus, hardware.RescanHardware(reason="test"), id="rescan-1")
        [(_, first), (envelope, again)] = await wait_for(bus, Discovered, 2)

    assert again.inventory_hash == first.inventory_hash
    assert envelope.causationid == command.id


async def test_a_driver_result_makes_the_agent_scan_again(
    bus: InMemoryBus, make_agent: Agents, host: HostRoot
) -> None:
    async with running(make_agent()):
        await wait_for(bus, Discovered, 1)
        unload_gpu_driver(host)
        result = driver.DriverUnloaded(
            command_id="unload-1", component=driver.Component.GPU, version="580.159.04"
        )
        cause = await send_event(bus, result, correlationid="saga-1")
        [_, (envelope, after)] = await wait_for(bus, Discovered, 2)

    assert after.gpus == ()
    assert envelope.causationid == cause.id
    assert envelope.correlationid == "saga-1"


async def test_only_driver_results_that_change_what_is_loaded_or_carved_make_it_scan(
    make_agent: Agents, nvml: CountingNvml
) -> None:
    agent = make_agent()
    await agent.scan()
    results = {
        driver.DriverInstalled(
            command_id="c-1", component=driver.Component.GPU, version="590.10.01"
        ): 0,
        driver.DriverValidated(
            command_id="c-2", component=driver.Component.GPU, version="580.159.04", devices=2
        ): 0,
        driver.DriverLoaded(
            command_id="c-3", component=driver.Component.GPU, version="580.159.04"
        ): 1,
        driver.DriverRolledBack(
            command_id="c-4", component=driver.Component.GPU, version="580.159.04"
        ): 1,
        mig_commands.MigLayoutApplied(
            command_id="c-5", config="all-balanced", changed_gpus=(0,)
        ): 1,
        mig_commands.MigLayoutFailed(
            command_id="c-6",
            config="all-balanced",
            reason=mig_commands.MigFailureReason.APPLY_FAILED,
            restored=True,
        ): 1,
    }

    for result, scans in results.items():
        sessions = nvml.sessions
        envelope = new_event(result, node=NODE, source="/gpuop/test")
        await agent.on_driver_event(Delivery("subject", envelope, result, 1, 1))
        assert nvml.sessions == sessions + scans, type(result).__name__


async def test_pause_stops_nvml_use_and_is_confirmed_then_resume_is_confirmed(
    bus: InMemoryBus, make_agent: Agents, nvml: CountingNvml, host: HostRoot
) -> None:
    agent = make_agent()
    async with running(agent):
        await wait_for(bus, Discovered, 1)
        pause = device.PauseOperands(components=(driver.Component.GPU,), reason="upgrade")
        command = await send_command(bus, pause, id="pause-1")
        [(envelope, paused)] = await wait_for(bus, device.OperandPaused, 1)
        assert (paused.command_id, paused.service) == ("pause-1", "discovery")
        assert envelope.causationid == command.id

        sessions = nvml.sessions
        assert (await agent.scan()).gpus != ()  # same driver: the GPUs are still known
        unload_gpu_driver(host)
        while_unloaded = await agent.scan()
        assert nvml.sessions == sessions
        assert while_unloaded.gpus == ()

        SimKernel(host).modprobe("nvidia")
        await send_command(bus, device.ResumeOperands(reason="validated"), id="resume-1")
        [(_, resumed)] = await wait_for(bus, device.OperandResumed, 1)
        [*_, (_, after)] = await wait_for(bus, Discovered, 3)

    assert (resumed.command_id, resumed.service) == ("resume-1", "discovery")
    assert nvml.sessions > sessions
    assert len(after.gpus) == 2
    assert not agent.paused


async def test_a_pause_for_the_network_driver_only_is_confirmed_without_pausing(
    bus: InMemoryBus, make_agent: Agents
) -> None:
    agent = make_agent()
    async with running(agent):
        pause = device.PauseOperands(components=(driver.Component.OFED,))
        await send_command(bus, pause, id="pause-ofed")
        await wait_for(bus, device.OperandPaused, 1)

    assert not agent.paused


async def test_a_restarted_agent_stays_paused_until_resumed(
    bus: InMemoryBus, make_agent: Agents, nvml: CountingNvml
) -> None:
    async with running(make_agent()):
        pause = device.PauseOperands(components=(driver.Component.GPU, driver.Component.OFED))
        await send_command(bus, pause, id="pause-1")
        await wait_for(bus, device.OperandPaused, 1)

    restarted = make_agent()
    await restarted.restore()
    sessions = nvml.sessions
    await restarted.scan()

    assert restarted.paused
    assert nvml.sessions == sessions


async def test_a_first_scan_that_fails_reports_why_the_agent_is_not_ready(
    bus: InMemoryBus, tmp_path: Path, nvml: CountingNvml
) -> None:
    reports: list[tuple[bool, str]] = []
    agent = NodeAgent(
        bus,
        NODE,
        HostRoot(tmp_path),
        nvml,  # type: ignore[arg-type]
        QUIET,
        readiness=lambda ready, reason: reports.append((ready, reason)),
    )

    async with running(agent):
        async with asyncio.timeout(5):
            while not reports:
                await asyncio.sleep(0.01)

    ready, reason = reports[0]
    assert not ready
    assert "the first scan failed" in reason
    assert "proc/version" in reason
    assert await published(bus, Discovered) == []
