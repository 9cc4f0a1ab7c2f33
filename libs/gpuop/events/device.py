"""GPU health, and the pause that makes node operands let go of the GPUs.

`DeviceHealthChanged` is published by telemetry when NVML reports an XID or an ECC error on a
GPU, or when a GPU recovers. The device plugin consumes it to mark the device unhealthy for the
kubelet; the upgrade orchestrator may consume it to judge validation.

A kernel module cannot be unloaded while anything holds `/dev/nvidia*`. So before a driver
reload, the upgrade orchestrator sends `PauseOperands` to the service group `operands` on the
node (`gpuop.cmd.operands.<node>.pause`): every operand service there (device plugin,
telemetry, discovery) consumes it, releases its device handles, and confirms with its own
`OperandPaused`. `ResumeOperands` / `OperandResumed` undo it after validation or on
compensation. The orchestrator waits until every operand the policy deploys has confirmed.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from gpuop.events.driver import Component
from gpuop.events.envelope import Command, Event
from gpuop.events.fields import Count, DocumentedEnum, GpuUuid, Message, MessageId

OPERANDS = "operands"
"""Command group that every operand service on a node subscribes to."""


class OperandService(DocumentedEnum):
    """Node services that hold GPU handles and must release them for a driver reload."""

    DEVICE_PLUGIN = "device-plugin"
    """Advertises GPUs and RDMA devices to the kubelet; stops advertising while paused."""
    TELEMETRY = "telemetry"
    """Exports GPU metrics; stops collecting while paused."""
    DISCOVERY = "discovery"
    """Reads the NVML inventory; reads only the host root while paused."""


class HealthReason(DocumentedEnum):
    """Why a GPU's health changed."""

    XID = "xid"
    """NVML reported a critical XID error; see `xid`."""
    ECC = "ecc"
    """Uncorrectable ECC errors appeared, or a row remapping is pending."""
    UNREACHABLE = "unreachable"
    """NVML cannot talk to the GPU (fell off the bus, lost handle)."""
    RECOVERED = "recovered"
    """The GPU answers again and no longer reports the error."""


class DeviceHealthChanged(Event):
    """A GPU became unhealthy, or healthy again."""

    DOMAIN: ClassVar[str] = "device"
    NAME: ClassVar[str] = "health-changed"

    gpu_uuid: GpuUuid
    """The GPU whose health changed."""
    healthy: bool
    """Health after the change."""
    reason: HealthReason
    """What changed it."""
    xid: Annotated[int, Field(ge=0, le=65535)] | None = None
    """XID error code, when `reason` is `xid`."""
    ecc_volatile_uncorrected: Count | None = None
    """Uncorrectable ECC errors since the driver loaded, when known."""
    ecc_aggregate_uncorrected: Count | None = None
    """Uncorrectable ECC errors over the GPU's lifetime, when known."""
    message: Message = ""
    """Detail for operators."""


class PauseOperands(Command):
    """The operands on the node (device plugin, discovery, telemetry) release what they hold
    of the named driver stacks before a reload: NVML sessions for `gpu`, RDMA handles for
    `ofed`; the device plugin advertises those devices Unhealthy meanwhile. Each confirms
    with `OperandPaused`."""

    SERVICE: ClassVar[str] = OPERANDS
    VERB: ClassVar[str] = "pause"

    components: tuple[Component, ...] = Field(min_length=1, max_length=2)
    """Driver stacks about to be reloaded; an operand releases what it holds of them."""
    reason: Message = ""
    """Why, for the log."""


class ResumeOperands(Command):
    """Operands on the node may open their device handles again."""

    SERVICE: ClassVar[str] = OPERANDS
    VERB: ClassVar[str] = "resume"

    reason: Message = ""
    """Why, for the log."""


class OperandPaused(Event):
    """One operand service released its device handles."""

    DOMAIN: ClassVar[str] = "device"
    NAME: ClassVar[str] = "operand-paused"

    command_id: MessageId
    """Envelope id of the `PauseOperands` this confirms."""
    service: OperandService
    """The operand that confirmed."""


class OperandResumed(Event):
    """One operand service uses its devices again."""

    DOMAIN: ClassVar[str] = "device"
    NAME: ClassVar[str] = "operand-resumed"

    command_id: MessageId
    """Envelope id of the `ResumeOperands` this confirms."""
    service: OperandService
    """The operand that confirmed."""
