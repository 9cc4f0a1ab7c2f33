"""`spans.handling`: a command handled on the bus continues its sender's trace, and what the
handler publishes continues the handling's span; with tracing off the trace passes through."""

from __future__ import annotations

import asyncio

from opentelemetry import trace

from gpuop.bus import ConsumerSpec, Delivery, InMemoryBus, spans
from gpuop.events import Envelope, decode, device, driver, new_command, new_event, subjects
from tests.support.spans import recorded_spans, untraced

NODE = "gpu-1"
SENDER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def pause_and_confirm(bus: InMemoryBus) -> Envelope:
    """Send a pause with `SENDER` as its trace parent to a handler that confirms it."""

    async def handle(delivery: Delivery) -> None:
        with spans.handling(__name__, delivery):
            paused = device.OperandPaused(
                command_id=delivery.envelope.id, service=device.OperandService.TELEMETRY
            )
            await bus.publish(new_event(paused, node=NODE, source="/test"))

    commands = subjects.commands_filter(device.OPERANDS, NODE, prefix=bus.prefix)
    subscription = await bus.consume(ConsumerSpec(durable="operand", subjects=(commands,)), handle)
    try:
        pause = device.PauseOperands(components=(driver.Component.GPU,))
        await bus.publish(
            new_command(pause, node=NODE, source="/test", id="pause-1", correlationid="saga-1",
                        traceparent=SENDER)
        )  # fmt: skip
        confirmations = subjects.events_filter("device", NODE, prefix=bus.prefix)
        async with asyncio.timeout(5):
            while not (found := [m async for m in bus.read(confirmations)]):
                await asyncio.sleep(0.005)
    finally:
        await subscription.stop()
    return decode(found[0].data)[0]


async def test_handling_continues_the_senders_trace_and_parents_what_it_publishes(
    bus: InMemoryBus,
) -> None:
    with recorded_spans() as exporter:
        confirmation = await pause_and_confirm(bus)
        [span] = exporter.get_finished_spans()

    assert span.name == "handle pause"
    assert span.kind is trace.SpanKind.CONSUMER
    assert f"{span.context.trace_id:032x}" == SENDER.split("-")[1]
    assert span.parent is not None and f"{span.parent.span_id:016x}" == SENDER.split("-")[2]
    assert span.attributes is not None
    assert span.attributes["messaging.message.id"] == "pause-1"
    assert span.attributes["messaging.message.conversation_id"] == "saga-1"
    assert span.attributes["k8s.node.name"] == NODE
    assert confirmation.traceparent == (
        f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-01"
    )


async def test_with_tracing_off_the_senders_trace_passes_through(bus: InMemoryBus) -> None:
    with untraced():
        confirmation = await pause_and_confirm(bus)
    assert confirmation.traceparent == SENDER
