"""A GPU reset on one simulated node, as the remediation saga drives it: telemetry reports an
uncorrectable ECC error, the operands pause, the driver-manager resets the GPU, the operands
resume, and telemetry's next NVML session finds the GPU clean and reports it `recovered`;
with the reset fault set, the reset fails and the GPU stays unhealthy. Telemetry and the
driver-manager each have their own simulated NVML, sharing only the host root."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuop.bus import InMemoryBus
from gpuop.events import Command, device, driver, new_command, remediation_commands
from gpuop.events.device import DeviceHealthChanged, HealthReason
from gpuop.host.roots import HostRoot
from gpuop.services.telemetry.node_exporter import NodeExporter
from gpuop_sim.host import simreset
from gpuop_sim.nvml.modules import HostRootModules
from gpuop_sim.nvml.sim_gpus import gpu_uuid
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.driver_manager import NODE, build_source, running_agent, seed
from tests.support.node_agents import published, running, wait_for
from tests.support.telemetry import QUIET
from tests.support.waiting import eventually


@pytest.fixture
def host(tmp_path: Path) -> HostRoot:
    return seed(tmp_path / "host")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    build_source(tmp_path / "source")
    return tmp_path / "source"


async def command(bus: InMemoryBus, payload: Command, id: str) -> None:
    await bus.publish(new_command(payload, node=NODE, source="/gpuop/test", id=id))


async def reset_answer(
    bus: InMemoryBus, command_id: str
) -> remediation_commands.GpuReset | remediation_commands.GpuResetFailed:
    """The driver-manager's answer to `command_id`, once published."""
    async with asyncio.timeout(10):
        while True:
            for kind in (remediation_commands.GpuReset, remediation_commands.GpuResetFailed):
                for envelope, answer in await published(bus, kind):
                    if envelope.causationid == command_id:
                        return answer
            await asyncio.sleep(0.01)


async def pause_reset_resume(
    bus: InMemoryBus, reset: remediation_commands.ResetGpu
) -> remediation_commands.GpuReset | remediation_commands.GpuResetFailed:
    """The saga's middle: pause the operands, reset, resume; the reset's answer."""
    await command(bus, device.PauseOperands(components=(driver.Component.GPU,)), "pause-1")
    await wait_for(bus, device.OperandPaused, 1)
    await command(bus, reset, "reset-1")
    answer = await reset_answer(bus, "reset-1")
    await command(bus, device.ResumeOperands(), "resume-1")
    await wait_for(bus, device.OperandResumed, 1)
    return answer


@pytest.mark.parametrize("fault", [None, simreset.FAIL])
async def test_a_reset_gpu_is_recovered_for_telemetry_and_a_failed_one_is_not(
    bus: InMemoryBus, host: HostRoot, source: Path, fault: str | None
) -> None:
    simreset.set_fault(host, fault)
    telemetry_nvml = SimNvml(8, node=NODE, module_state=HostRootModules(host.path))
    exporter = NodeExporter(bus, NODE, telemetry_nvml, QUIET, CollectorRegistry())
    broken = gpu_uuid(NODE, 3)
    async with running_agent(bus, host, source), running(exporter):
        await eventually(lambda: bool(exporter.exposition()))
        telemetry_nvml.inject_ecc(3, volatile_uncorrected=1)
        await wait_for(bus, DeviceHealthChanged, 1)

        answer = await pause_reset_resume(bus, remediation_commands.ResetGpu(gpu_uuids=(broken,)))

        if fault is None:
            events = await wait_for(bus, DeviceHealthChanged, 2)
        else:
            await exporter.collect()
            events = await wait_for(bus, DeviceHealthChanged, 1)

    changes = [(e.gpu_uuid, e.healthy, e.reason) for _, e in events]
    if fault is None:
        assert isinstance(answer, remediation_commands.GpuReset)
        assert changes == [
            (broken, False, HealthReason.ECC),
            (broken, True, HealthReason.RECOVERED),
        ]
    else:
        assert isinstance(answer, remediation_commands.GpuResetFailed)
        assert answer.reason is remediation_commands.ResetFailureReason.RESET_FAILED
        assert changes == [(broken, False, HealthReason.ECC)]
