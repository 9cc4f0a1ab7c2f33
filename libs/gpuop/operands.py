"""What every node operand shares about pause and resume: which driver stacks are paused.

The upgrade orchestrator pauses a node's operands before a driver reload and resumes them
after (`device.PauseOperands` / `ResumeOperands` on the `operands` command group); a pause
names the driver stacks about to be reloaded. Each operand service on the node (discovery,
telemetry, the device plugin) applies every command it handles with `after`, and a
restarted one replays the node's stored commands through `from_log`, so it never reopens
a driver's devices in the middle of a reload. Discovery and telemetry hold NVML, which
only the GPU driver's reload takes away (`gpu_paused_after`); a pause for the network
driver alone changes nothing they hold.

`handle` is the one pause/resume handler: each operand is an `Operand` (its service, what
it does to pause and to resume, how it publishes), and `handle` applies a command and sends
the confirmation the orchestrator waits for.
"""

from __future__ import annotations

from typing import Protocol

from gpuop.bus import Bus, Delivery
from gpuop.events import (
    Envelope,
    Event,
    MalformedMessage,
    Payload,
    UnknownEventType,
    decode_on,
    device,
    subjects,
)
from gpuop.events.driver import Component

NOTHING_PAUSED: frozenset[Component] = frozenset()


def after(paused: frozenset[Component], command: Payload) -> frozenset[Component]:
    """The paused driver stacks after `command`, given those paused before."""
    if isinstance(command, device.PauseOperands):
        return paused | frozenset(command.components)
    if isinstance(command, device.ResumeOperands):
        return NOTHING_PAUSED
    return paused


def gpu_paused_after(paused: bool, command: Payload) -> bool:
    """Whether the GPU driver (and NVML with it) is paused after `command`, given whether it
    was before."""
    before = frozenset({Component.GPU}) if paused else NOTHING_PAUSED
    return Component.GPU in after(before, command)


class Operand(Protocol):
    """An operand service on a node, as the pause/resume handler sees it."""

    @property
    def service(self) -> device.OperandService:
        """Which operand confirms."""
        ...

    async def pause(self, command: device.PauseOperands) -> None:
        """Release what it holds of `command.components`; it is confirmed afterwards."""
        ...

    async def resume(self, command: device.ResumeOperands) -> None:
        """May open its devices again; it is confirmed afterwards."""
        ...

    async def confirm(self, confirmation: Event, cause: Envelope) -> None:
        """Publish `confirmation` of the command `cause`."""
        ...


async def handle(operand: Operand, delivery: Delivery) -> bool:
    """Apply a `PauseOperands` or `ResumeOperands` to `operand`, then confirm it with
    `OperandPaused` or `OperandResumed`; False (and nothing done) for any other payload."""
    payload, envelope = delivery.payload, delivery.envelope
    if isinstance(payload, device.PauseOperands):
        await operand.pause(payload)
        paused = device.OperandPaused(command_id=envelope.id, service=operand.service)
        await operand.confirm(paused, envelope)
        return True
    if isinstance(payload, device.ResumeOperands):
        await operand.resume(payload)
        resumed = device.OperandResumed(command_id=envelope.id, service=operand.service)
        await operand.confirm(resumed, envelope)
        return True
    return False


async def from_log(bus: Bus, node: str) -> frozenset[Component]:
    """The driver stacks the node's stored pause and resume commands leave paused."""
    paused = NOTHING_PAUSED
    operands = subjects.commands_filter(device.OPERANDS, node, prefix=bus.prefix)
    async for stored in bus.read(operands):
        try:
            _, command = decode_on(stored.subject, stored.data)
        except (MalformedMessage, UnknownEventType):
            continue
        paused = after(paused, command)
    return paused
