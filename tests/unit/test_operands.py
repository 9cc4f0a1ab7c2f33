"""Pause and resume as every node operand reads them: the paused driver stacks after each
command, NVML's share of that, and the state a restarted operand reads from the log."""

from __future__ import annotations

import pytest

from gpuop import operands
from gpuop.bus import InMemoryBus, streams
from gpuop.events import Payload, device, hardware, new_command
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
