"""Pause and resume as every node operand reads them: the paused driver stacks after each
command, NVML's share of that, the state a restarted operand reads from the log, and the one
handler that applies a command and confirms it."""

from __future__ import annotations

import pytest

from gpuop import operands
from gpuop.bus import Delivery, InMemoryBus, streams
from gpuop.events import Command, Envelope, Event, Payload, device, hardware, ids, new_command
from gpuop.events.driver import Component

GPU, OFED = Component.GPU, Component.OFED
NODE = "gpu-1.example.com"


def pause(*components: Component) -> device.PauseOperands:
    return device.PauseOperands(components=components)


def test_pauses_add_up_and_a_resume_ends_them_all() -> None:
    paused = operands.after(operands.NOTHING_PAUSED, pause(OFED))
    paused = operands.after(paused, pause(GPU))

    assert paused == {GPU, OFED}
    assert operands.after(paused, hardware.RescanHardware()) == paused
    assert operands.after(paused, device.ResumeOperands()) == operands.NOTHING_PAUSED


@pytest.mark.parametrize(
    ("before", "command", "after"),
    [
        (False, pause(OFED), False),
        (False, pause(GPU, OFED), True),
        (True, pause(OFED), True),
        (True, device.ResumeOperands(), False),
        (True, hardware.RescanHardware(), True),
    ],
    ids=repr,
)
def test_only_a_pause_of_the_gpu_driver_takes_nvml_away(
    before: bool, command: Payload, after: bool
) -> None:
    assert operands.gpu_paused_after(before, command) is after


async def test_a_restarted_operand_reads_the_pause_its_node_is_in(bus: InMemoryBus) -> None:
    assert await operands.from_log(bus, NODE) == operands.NOTHING_PAUSED

    for number, command in enumerate([pause(GPU), device.ResumeOperands(), pause(OFED)]):
        await bus.publish(new_command(command, node=NODE, source="/test", id=f"c-{number}"))
    await bus.publish(new_command(pause(GPU), node="gpu-2", source="/test", id="other-node"))

    assert await operands.from_log(bus, NODE) == {OFED}


def test_durable_names_keep_short_node_names_and_shorten_long_ones_stably() -> None:
    long = "gpu-" + "x" * 80 + ".example.com"

    assert streams.node_durable("telemetry", NODE, "commands") == (
        "telemetry-gpu-1_example_com-commands"
    )
    shortened = streams.node_durable("telemetry", long, "commands")
    assert len(shortened) < len(long)
    assert shortened == streams.node_durable("telemetry", long, "commands")
    assert shortened != streams.node_durable("telemetry", long + "x", "commands")


class RecordingOperand:
    """An `Operand` that writes down what the handler asked of it, in order."""

    service = device.OperandService.TELEMETRY

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.confirmed: list[tuple[Event, Envelope]] = []

    async def pause(self, command: device.PauseOperands) -> None:
        self.calls.append(f"pause {','.join(command.components)}")

    async def resume(self, command: device.ResumeOperands) -> None:
        self.calls.append("resume")

    async def confirm(self, confirmation: Event, cause: Envelope) -> None:
        self.calls.append(f"confirm {type(confirmation).__name__}")
        self.confirmed.append((confirmation, cause))


def delivered(payload: Command) -> Delivery:
    envelope = new_command(payload, node="gpu-1", source="/test", id=ids.step("s/gpu-1", "x", 1))
    return Delivery(subject="s", envelope=envelope, payload=payload, attempt=1, stream_seq=1)


async def test_the_one_handler_pauses_or_resumes_then_confirms_with_the_command_id() -> None:
    operand = RecordingOperand()
    pause = delivered(device.PauseOperands(components=(Component.GPU,)))
    resume = delivered(device.ResumeOperands())

    assert await operands.handle(operand, pause) and await operands.handle(operand, resume)

    assert operand.calls == [
        "pause gpu", "confirm OperandPaused", "resume", "confirm OperandResumed",
    ]  # fmt: skip
    for (confirmation, cause), sent in zip(operand.confirmed, (pause, resume), strict=True):
        assert cause is sent.envelope
        assert isinstance(confirmation, device.OperandPaused | device.OperandResumed)
        assert confirmation.command_id == sent.envelope.id
        assert confirmation.service is operand.service


async def test_any_other_command_is_left_to_the_service() -> None:
    operand = RecordingOperand()
    rescan = delivered(hardware.RescanHardware())
    assert not await operands.handle(operand, rescan)
    assert operand.calls == []
