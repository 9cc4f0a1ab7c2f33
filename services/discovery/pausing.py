"""Whether discovery may touch NVML: the operands pause, as the node's commands decide it.

The upgrade orchestrator pauses a node's operands before a driver reload and resumes them
after (`device.PauseOperands` / `ResumeOperands`). Discovery holds NVML only for a GPU
driver reload; a pause for the network driver alone changes nothing it holds. The node
agent applies each command with `after`, and a restarted agent replays the node's stored
commands through it (`from_log`), so it never reopens NVML in the middle of a reload.
"""

from __future__ import annotations

from gpuop.bus import Bus
from gpuop.events import MalformedMessage, Payload, UnknownEventType, decode, device, subjects
from gpuop.events.driver import Component


def after(paused: bool, command: Payload) -> bool:
    """Whether NVML is paused after `command`, given whether it was before."""
    if isinstance(command, device.PauseOperands):
        return paused or Component.GPU in command.components
    if isinstance(command, device.ResumeOperands):
        return False
    return paused


async def from_log(bus: Bus, node: str) -> bool:
    """Whether the node's stored pause and resume commands leave NVML paused."""
    paused = False
    operands = subjects.commands_filter(device.OPERANDS, node, prefix=bus.prefix)
    async for stored in bus.read(operands):
        try:
            _, command = decode(stored.data)
        except (MalformedMessage, UnknownEventType):
            continue
        paused = after(paused, command)
    return paused
