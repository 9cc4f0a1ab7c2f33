"""MIG reconfiguration on one node: `ApplyMigLayout` to its driver-manager, and the answer.

The MIG saga resolves the node's `nvidia.com/mig.config` label against a config in
mig-parted's format (`gpuop.policy.migconfig`) into one layout per GPU, pauses the node's
operands, evicts the pods of the GPUs being re-carved and sends `ApplyMigLayout`. The
driver-manager refuses while processes still hold those GPUs (`in-use`), else turns MIG mode
on or off and destroys and creates GPU and compute instances on the GPUs whose layout
changes, reads the result back and regenerates the node's CDI spec. Any failure puts back
the layout it read at the start (`restored`), and regenerates the spec for that.

Both answers are in domain `driver`, like every answer of the driver-manager, so they travel
on the subjects the driver-manager already publishes on and the orchestrator already reads.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, StringConstraints

from gpuop.events import driver
from gpuop.events.envelope import Command, Event
from gpuop.events.fields import (
    Count,
    DocumentedEnum,
    Message,
    MessageId,
    Record,
    TimeoutSeconds,
)

ConfigName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
"""A mig-parted config name, as the `nvidia.com/mig.config` label value names it."""
ProfileName = Annotated[
    str,
    StringConstraints(pattern=r"^([0-9]{1,2}c\.)?[0-9]{1,2}g\.[0-9]{1,4}gb([+-][a-z.]{1,16})?$"),
]
"""A MIG device profile: `1g.18gb`, `1g.18gb+me`, `1c.2g.35gb`."""
GpuIndex = Annotated[int, Field(ge=0, le=63)]


class MigDeviceCount(Record):
    """How many MIG devices of one profile a GPU is to have."""

    profile: ProfileName
    """The profile: `1g.18gb`."""
    count: Annotated[int, Field(ge=1, le=7)]
    """How many."""


class GpuMigLayout(Record):
    """What one GPU is to look like."""

    gpu_index: GpuIndex
    """NVML index of the GPU on the node."""
    mig_enabled: bool
    """MIG mode on or off."""
    devices: tuple[MigDeviceCount, ...] = Field(default=(), max_length=16)
    """MIG devices by profile, sorted by profile; empty when MIG is off (or on, but empty)."""


class MigFailureReason(DocumentedEnum):
    """Why a MIG layout was not applied."""

    IN_USE = "in-use"
    """Processes hold a GPU that was to be re-carved; nothing was changed."""
    INVALID_LAYOUT = "invalid-layout"
    """A GPU cannot take its layout (unknown profile, too many, no such GPU); unchanged."""
    NOT_SUPPORTED = "not-supported"
    """This node's GPUs or NVML backend cannot change MIG; nothing was changed."""
    MODE_PENDING = "mode-pending"
    """The MIG mode change waits for a GPU reset or a reboot (NVML says it is pending)."""
    APPLY_FAILED = "apply-failed"
    """NVML refused a step, or the layout read back differs from the one asked for."""
    CDI_FAILED = "cdi-failed"
    """The layout is applied but the CDI spec for its devices could not be written."""


class ApplyMigLayout(Command):
    """Give the node's GPUs these MIG layouts; GPUs not listed are left as they are. Sent by
    the MIG saga once the operands holding the GPUs are paused and their pods evicted."""

    SERVICE: ClassVar[str] = driver.SERVICE
    VERB: ClassVar[str] = "apply-mig-layout"

    config: ConfigName
    """The mig-parted config the layouts come from (the `nvidia.com/mig.config` value)."""
    layouts: tuple[GpuMigLayout, ...] = Field(min_length=1, max_length=64)
    """One layout per GPU to set, by index, each index at most once."""
    timeout_seconds: TimeoutSeconds = 300
    """How long the regeneration of the CDI spec may wait for NVML."""


class MigLayoutApplied(Event):
    """The node's GPUs have the layouts asked for, read back, and the CDI spec names their
    MIG devices."""

    DOMAIN: ClassVar[str] = "driver"
    NAME: ClassVar[str] = "mig-layout-applied"

    command_id: MessageId
    """Envelope id of the command this answers."""
    config: ConfigName
    """The config applied."""
    changed_gpus: tuple[GpuIndex, ...] = Field(default=(), max_length=64)
    """GPUs whose layout changed; empty when every GPU had its layout already."""
    mig_devices: Count = 0
    """MIG devices on the node afterwards."""


class MigLayoutFailed(Event):
    """The layouts were not applied; the node has the layout it had before when `restored`."""

    DOMAIN: ClassVar[str] = "driver"
    NAME: ClassVar[str] = "mig-layout-failed"

    command_id: MessageId
    """Envelope id of the command this answers."""
    config: ConfigName
    """The config asked for."""
    reason: MigFailureReason
    """Why."""
    restored: bool
    """Whether the GPUs have the layout read before the command again (true also when
    nothing was changed)."""
    message: Message = ""
    """What went wrong, naming the GPU and the NVML step, for operators."""
