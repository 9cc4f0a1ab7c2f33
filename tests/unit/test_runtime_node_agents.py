"""`NodeAgentBase`: a node agent refuses a node name no subject can carry, and publishes its
events about its node from its service's source, answering their cause."""

from __future__ import annotations

import pytest

from gpuop.bus import InMemoryBus
from gpuop.events import decode, device, hardware, new_command, subjects
from gpuop.runtime.node_agents import NodeAgentBase


async def test_an_agent_publishes_about_its_node_from_its_source_answering_the_cause() -> None:
    bus = InMemoryBus()
    await bus.start()
    agent = NodeAgentBase(bus, "discovery", "gpu-1.example.com", None)
    cause = new_command(
        hardware.RescanHardware(reason="test"),
        node="gpu-1.example.com",
        source="/gpuop/test",
        id="rescan-1",
        correlationid="saga-1",
    )

    paused = device.OperandPaused(command_id="rescan-1", service=device.OperandService.DISCOVERY)
    await agent._publish(paused, cause=cause)

    (stored,) = [m async for m in bus.read("gpuop.evt.device.>")]
    envelope, _ = decode(stored.data)
    assert stored.subject == "gpuop.evt.device.gpu-1_example_com.operand-paused"
    assert envelope.source == "/gpuop/discovery/gpu-1.example.com"
    assert (envelope.causationid, envelope.correlationid) == ("rescan-1", "saga-1")
    await bus.close()


def test_an_agent_refuses_a_node_name_no_subject_can_carry() -> None:
    with pytest.raises(subjects.InvalidSubject):
        NodeAgentBase(InMemoryBus(), "discovery", "GPU 1", None)


def test_an_agent_without_a_readiness_callback_reports_to_nobody() -> None:
    agent = NodeAgentBase(InMemoryBus(), "discovery", "gpu-1", None)

    agent._readiness(True, "")
