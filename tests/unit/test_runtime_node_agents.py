"""`NodeAgentBase`: a node agent refuses a node name no subject can carry, publishes its
events about its node from its service's source, answering their cause, and consumes its
node's messages for a block, stopping every subscription it made after it."""

from __future__ import annotations

from typing import Any, cast

import pytest

from gpuop.bus import Bus, ConsumerSpec, InMemoryBus
from gpuop.bus.errors import BusUnavailable
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


class _Subscription:
    def __init__(self, durable: str, stopped: list[str]) -> None:
        self.durable, self._stopped = durable, stopped

    async def stop(self) -> None:
        self._stopped.append(self.durable)


class _Bus:
    """Consumes until told to refuse one durable: what `_consuming` needs of a bus."""

    prefix = "gpuop"

    def __init__(self, refuse: str = "") -> None:
        self.refuse = refuse
        self.consumed: list[tuple[str, float]] = []
        self.stopped: list[str] = []

    async def consume(self, spec: ConsumerSpec, handler: Any) -> _Subscription:
        if spec.durable == self.refuse:
            raise BusUnavailable(f"cannot create {spec.durable}")
        self.consumed.append((spec.durable, spec.retry_delay))
        return _Subscription(spec.durable, self.stopped)


def _consumer(durable: str) -> Any:
    def consumer(prefix: str, node: str, *, retry_delay: float) -> ConsumerSpec:
        return ConsumerSpec(durable=f"{durable}-{node}", subjects=(), retry_delay=retry_delay)

    return consumer


async def _handler(delivery: Any) -> None:
    pass


async def test_consuming_subscribes_for_the_block_and_stops_in_order_after_it() -> None:
    bus = _Bus()
    agent = NodeAgentBase(cast(Bus, bus), "discovery", "gpu-1", None)

    with pytest.raises(RuntimeError, match="body"):
        async with agent._consuming(
            (_consumer("a"), _handler), (_consumer("b"), _handler), retry_delay=3.0
        ):
            assert bus.consumed == [("a-gpu-1", 3.0), ("b-gpu-1", 3.0)]
            assert bus.stopped == []
            raise RuntimeError("body")

    assert bus.stopped == ["a-gpu-1", "b-gpu-1"]


async def test_consuming_stops_the_subscriptions_made_before_one_that_failed() -> None:
    bus = _Bus(refuse="b-gpu-1")
    agent = NodeAgentBase(cast(Bus, bus), "discovery", "gpu-1", None)

    with pytest.raises(BusUnavailable):
        async with agent._consuming(
            (_consumer("a"), _handler), (_consumer("b"), _handler), retry_delay=1.0
        ):
            pytest.fail("the block must not run")

    assert bus.stopped == ["a-gpu-1"]
