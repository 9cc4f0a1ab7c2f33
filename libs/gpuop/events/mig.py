"""The MIG reconfiguration saga's public face: a node's reconfiguration started, and each
move it makes.

The upgrade orchestrator publishes these, and only it, in the domain `mig` (the request
that starts one is discovery's `gpuop.events.mig_requests.MigConfigRequested`; the command
the saga sends and its answers are the driver-manager's, `gpuop.events.mig_commands`).
`NodeMigStateChanged` goes out on every move, on the subject `gpuop.evt.mig.<node>.<state>`
named after the new state, as the upgrade's and the remediation's do, so a tool subscribes
to the states it cares about (`gpuop.evt.mig.*.mig-config-failed`).
`MigReconfigurationStarted` records the plan the saga was started with (`MigPlan`: the
layouts resolved from the policy's configs or its ConfigMap against the node's GPUs, and
the layout each re-carved GPU had), so `gpuop replay` builds the same saga without the
ConfigMap.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from gpuop.events.device import OperandService
from gpuop.events.envelope import Event, StateChangedEvent
from gpuop.events.fields import (
    Attempt,
    BootId,
    CorrelationId,
    Count,
    DocumentedEnum,
    GpuUuid,
    Message,
    MessageId,
    Record,
)
from gpuop.events.mig_commands import GpuMigLayout

DOMAIN = "mig"


class MigState(DocumentedEnum):
    """Where one node's MIG reconfiguration stands: the action still pending."""

    MIG_CONFIG_REQUIRED = "mig-config-required"
    """A config was requested; waits for a slot under `maxUnavailable` -> operands-pause."""
    OPERANDS_PAUSE_REQUIRED = "operands-pause-required"
    """The node's operands are to release the GPUs -> holders-eviction."""
    HOLDERS_EVICTION_REQUIRED = "holders-eviction-required"
    """The pods holding the GPUs being re-carved are to be listed and evicted -> apply."""
    APPLY_REQUIRED = "apply-required"
    """The driver-manager is to apply the layout -> verification, or restore/resume on failure."""
    REBOOT_REQUIRED = "reboot-required"
    """The GPUs' MIG mode stays pending until a reboot: a new boot id -> apply again."""
    VERIFICATION_REQUIRED = "verification-required"
    """The layout the node reported is compared with the request -> resume, or restore."""
    RESTORE_REQUIRED = "restore-required"
    """The layout recorded at the start is to be put back -> operands-resume (then failed)."""
    OPERANDS_RESUME_REQUIRED = "operands-resume-required"
    """The operands are to use the GPUs again -> done, or failed after a failure."""
    MIG_CONFIG_DONE = "mig-config-done"
    """The node has the requested layout; final."""
    MIG_CONFIG_FAILED = "mig-config-failed"
    """The request failed with its reason; final (a new label value starts a new saga)."""


class ConfigState(DocumentedEnum):
    """Values of `nvidia.com/mig.config.state`, upstream's. gpuop reboots the node only for
    a MIG mode NVML leaves pending until one (`rebooting`); otherwise the driver-manager
    resets the GPUs it re-carves."""

    PENDING = "pending"
    """A reconfiguration is under way (or waiting for its slot)."""
    REBOOTING = "rebooting"
    """The node reboots for a MIG mode change that stays pending until then."""
    SUCCESS = "success"
    """The node has the layout its label names."""
    FAILED = "failed"
    """The last reconfiguration failed; the reason is in the node's Event and the saga."""


MAX_GPUS = 64


class RecarvedGpu(Record):
    """A GPU whose layout the request changes."""

    index: int = Field(ge=0, le=63)
    """NVML index on the node."""
    uuid: GpuUuid
    """What the device plugin names it by (`ListGpuHolders`)."""
    previous: GpuMigLayout | None = None
    """Its layout at the start when fully known; None: MIG on, devices not reported."""


class MigPlan(Record):
    """What a request does to one node; see the module docstring."""

    config: str = Field(max_length=63)
    """The label's value: the config name requested."""
    layouts: tuple[GpuMigLayout, ...] = Field(default=(), max_length=MAX_GPUS)
    """Every GPU the config selects, with its layout, by index."""
    recarved: tuple[RecarvedGpu, ...] = Field(default=(), max_length=MAX_GPUS)
    """The GPUs whose layout changes, by index."""
    other_mig_devices: Count | None = 0
    """MIG devices on the GPUs the request leaves alone, when known; None: one of them has
    MIG on and no device reported."""
    problem: Message = ""
    """Why the request cannot run; empty when it can."""

    @property
    def restorable(self) -> bool:
        """Whether the saga itself can put the start's layout back on every re-carved GPU."""
        return all(gpu.previous is not None for gpu in self.recarved)

    def expected_mig_devices(self) -> int | None:
        """MIG devices the node has once the layouts are applied, when known."""
        if self.other_mig_devices is None:
            return None
        wanted = sum(d.count for layout in self.layouts for d in layout.devices)
        return wanted + self.other_mig_devices


class MigReconfigurationStarted(Event):
    """A node's MIG reconfiguration started, with the plan it runs."""

    DOMAIN: ClassVar[str] = DOMAIN
    NAME: ClassVar[str] = "started"

    saga_id: CorrelationId
    """The reconfiguration (also the envelope's `correlationid`)."""
    request_id: MessageId
    """The request it answers (a `MigConfigRequested`'s envelope id, or one derived for a
    request queued behind an earlier reconfiguration)."""
    plan: MigPlan
    """The layouts requested and the one each re-carved GPU had."""
    operands: tuple[OperandService, ...] = tuple(OperandService)
    """The operand services that must confirm a pause."""
    boot_id: BootId | None = None
    """The node's boot id when it started (its inventory's): a reboot for a pending MIG
    mode is confirmed by another."""


class NodeMigStateChanged(StateChangedEvent):
    """A node's MIG reconfiguration moved to a new state; published on that state's subject."""

    DOMAIN: ClassVar[str] = DOMAIN
    NAME: ClassVar[str] = "state-changed"

    saga_id: CorrelationId
    """The reconfiguration (also the envelope's `correlationid`)."""
    config: str = Field(max_length=63)
    """The config requested."""
    from_state: MigState | None = None
    """State before the change."""
    to_state: MigState
    """State after the change: the last token of the subject."""
    config_state: ConfigState
    """`nvidia.com/mig.config.state` after the change."""
    reason: Message = ""
    """Why the saga moved, in words."""
    attempt: Attempt = 1
    """The reconfiguration's attempt."""
