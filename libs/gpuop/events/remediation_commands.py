"""Commands the remediation saga sends to one node's agents, and their answers.

The upgrade orchestrator's remediation saga (issue 21) acts on a GPU that telemetry reported
unhealthy. Two node agents take part:

- the device plugin knows which pods hold which GPUs (its allocations and the kubelet's
  PodResources), so the saga asks it with `ListGpuHolders`
  (`gpuop.cmd.device-plugin.<node>.list-gpu-holders`) which pods to wait for or evict; it
  answers `GpuHoldersListed`, or `GpuHoldersUnknown` when the kubelet cannot be asked;
- the driver-manager resets the GPUs with `ResetGpu`
  (`gpuop.cmd.driver-manager.<node>.reset-gpu`) once they are free, alone through the
  kernel's function reset, or, when allowed, by unloading and loading the GPU driver when a
  GPU cannot be reset alone; it answers `GpuReset` or `GpuResetFailed`, whose `reason` tells
  the saga whether to wait (`in-use`), reboot (`not-supported`, `reset-failed`, `timeout`).

Each answer carries the id of the command it answers (`command_id`) and the GPUs it was
about, as the driver results do. The driver-manager's answers are in its domain `driver`
and the device plugin's in `device`, so the NATS permissions that let only a node's own
driver-manager publish `driver` events about it, and only its device plugin its named
`device` events, bind each answer to the agent that may give it.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from gpuop.events import driver
from gpuop.events.envelope import Command, Event
from gpuop.events.fields import (
    DocumentedEnum,
    GpuUuid,
    Message,
    MessageId,
    NamespacedName,
    TimeoutSeconds,
)

DEVICE_PLUGIN = "device-plugin"
"""The service the holder listing goes to: one node's device plugin."""
MAX_GPUS = 64
"""GPUs one command may name: more than any node carries."""
MAX_PODS = 1024
"""Pods one listing names: far more than one node's GPUs can be allocated to."""


class ResetMethod(DocumentedEnum):
    """How the driver-manager reset the GPUs."""

    NVML = "nvml"
    """Each GPU alone (the kernel's function reset of its PCI device); the others run on."""
    DRIVER_RELOAD = "driver-reload"
    """The GPU driver's modules unloaded and loaded again: every GPU of the node reset."""


class ResetFailureReason(DocumentedEnum):
    """Why the GPUs were not reset."""

    IN_USE = "in-use"
    """Processes hold the GPUs (for a driver reload: any GPU of the node)."""
    NOT_SUPPORTED = "not-supported"
    """A GPU cannot be reset alone (NVLink peers, no function reset); no reload allowed."""
    RESET_FAILED = "reset-failed"
    """The reset was tried and failed, or the GPU reports its errors after it."""
    TIMEOUT = "timeout"
    """The reset did not finish within the command's timeout."""


class ResetGpu(Command):
    """Reset the named GPUs of the node, which must be free: refused with `in-use` while any
    process holds one. Each GPU is reset alone when it can be; when one cannot (NVLink peers
    in use, no function reset, or its reset failed) and `allow_driver_reload`, the GPU
    driver is unloaded and loaded again instead."""

    SERVICE: ClassVar[str] = driver.SERVICE
    VERB: ClassVar[str] = "reset-gpu"

    gpu_uuids: tuple[GpuUuid, ...] = Field(min_length=1, max_length=MAX_GPUS)
    """The GPUs to reset."""
    allow_driver_reload: bool = False
    """Whether a driver unload and load may stand in for a reset of one GPU alone (it
    resets every GPU of the node, so every GPU must be free)."""
    timeout_seconds: TimeoutSeconds = 300
    """How long the whole reset, a driver reload included, may take."""


class ListGpuHolders(Command):
    """Name the pods that have any of the named GPUs allocated, from the device plugin's
    allocations and the kubelet's PodResources."""

    SERVICE: ClassVar[str] = DEVICE_PLUGIN
    VERB: ClassVar[str] = "list-gpu-holders"

    gpu_uuids: tuple[GpuUuid, ...] = Field(min_length=1, max_length=MAX_GPUS)
    """The physical GPUs asked about (a MIG device or a shared replica counts as its GPU)."""


class GpuReset(Event):
    """The GPUs were reset; telemetry reports them `recovered` once they answer clean."""

    DOMAIN: ClassVar[str] = "driver"
    NAME: ClassVar[str] = "gpu-reset"

    command_id: MessageId
    """Envelope id of the `ResetGpu` this answers."""
    gpu_uuids: tuple[GpuUuid, ...] = Field(min_length=1, max_length=MAX_GPUS)
    """The GPUs the command named."""
    method: ResetMethod
    """How they were reset."""


class GpuResetFailed(Event):
    """The GPUs were not reset (or not all of them)."""

    DOMAIN: ClassVar[str] = "driver"
    NAME: ClassVar[str] = "gpu-reset-failed"

    command_id: MessageId
    """Envelope id of the `ResetGpu` this answers."""
    gpu_uuids: tuple[GpuUuid, ...] = Field(min_length=1, max_length=MAX_GPUS)
    """The GPUs the command named."""
    reason: ResetFailureReason
    """Why."""
    message: Message = ""
    """What went wrong, for operators: the holders, the GPU that failed, the kernel's error."""


class GpuHoldersListed(Event):
    """The pods that hold the GPUs asked about (none: the GPUs are free of pods)."""

    DOMAIN: ClassVar[str] = "device"
    NAME: ClassVar[str] = "gpu-holders-listed"

    command_id: MessageId
    """Envelope id of the `ListGpuHolders` this answers."""
    gpu_uuids: tuple[GpuUuid, ...] = Field(min_length=1, max_length=MAX_GPUS)
    """The GPUs the command named."""
    pods: tuple[NamespacedName, ...] = Field(default=(), max_length=MAX_PODS)
    """Pods with any of those GPUs allocated, each once, sorted by namespace and name."""


class GpuHoldersUnknown(Event):
    """The device plugin could not tell which pods hold the GPUs."""

    DOMAIN: ClassVar[str] = "device"
    NAME: ClassVar[str] = "gpu-holders-unknown"

    command_id: MessageId
    """Envelope id of the `ListGpuHolders` this answers."""
    message: Message = ""
    """Why: the kubelet's PodResources socket did not answer, or answered an error."""
