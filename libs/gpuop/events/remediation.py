"""The remediation saga's public face: a node's remediation started, and each move it makes.

The upgrade orchestrator publishes these, and only it, in the domain `remediation` (the
commands the saga sends node agents, and their answers, are in `gpuop.events.remediation_commands`).
`NodeRemediationStateChanged` goes out on every move of a node's remediation, on the subject
`gpuop.evt.remediation.<node>.<state>` named after the new state, as the upgrade's state
changes are, so a tool subscribes to exactly the states it cares about
(`gpuop.evt.remediation.*.remediation-failed`). `RemediationStarted` records what the saga
was started from, so `gpuop replay` builds the same saga, and the circuit breaker's
decision, taken from the starts before it, replays too. `RemediationRefused` records the
breaker's other answer: a health event that called for a remediation it did not start, once
per health event (its id is derived from that event's), so a replay refuses it again.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import AwareDatetime, Field

from gpuop.events.device import XidAction
from gpuop.events.dra import DeviceName
from gpuop.events.envelope import Event, StateChangedEvent
from gpuop.events.fields import (
    Attempt,
    BootId,
    CorrelationId,
    Count,
    DocumentedEnum,
    GpuUuid,
    Message,
    Token,
    Version,
)
from gpuop.events.hardware import PciAddress

DOMAIN = "remediation"
MAX_GPUS = 64
MAX_XIDS = 16


class RemediationState(DocumentedEnum):
    """Where a node is in its GPU remediation; each state names the action still pending."""

    ADMISSION_REQUIRED = "remediation-admission-required"
    """Quarantined (tainted, condition False); waits for a slot of `maxUnavailable`."""
    HOLDERS_REQUIRED = "gpu-holders-required"
    """Admitted; the device plugin names the pods holding the affected GPUs."""
    EVICTION_REQUIRED = "gpu-pods-eviction-required"
    """Those pods, and only those, are evicted; then operands-pause-required."""
    OPERANDS_PAUSE_REQUIRED = "operands-pause-required"
    """The node's operands release the GPUs; then gpu-reset-required."""
    RESET_REQUIRED = "gpu-reset-required"
    """The driver-manager resets the GPUs; reboot-required when that fails and is allowed."""
    REBOOT_REQUIRED = "reboot-required"
    """The node reboots; a new boot id moves it to validation-required."""
    VALIDATION_REQUIRED = "validation-required"
    """The validation ladder after the reset or the reboot; then release-required."""
    FOLDED = "folded-into-upgrade"
    """The node's upgrade was under way: its reload and validation serve, and end it."""
    RELEASE_REQUIRED = "release-required"
    """Validated: operands resumed, taint removed, condition True; then remediation-done."""
    REPLACEMENT_REQUIRED = "hardware-replacement-required"
    """Handed over for new hardware (cordoned, labelled); held until a release and a new GPU."""
    DONE = "remediation-done"
    """The GPUs validated again and the node is back in service."""
    FAILED = "remediation-failed"
    """A step failed: the node stays tainted, its condition False with the reason."""


TERMINAL_STATES = frozenset({RemediationState.DONE, RemediationState.FAILED})
"""States in which a remediation takes no further action."""


class RemediationStarted(Event):
    """The orchestrator started remediating a node (its first record, from these inputs and
    the policy in force): recorded so a replay builds the same saga and checks the circuit
    breaker's decision against the starts before it."""

    DOMAIN: ClassVar[str] = DOMAIN
    NAME: ClassVar[str] = "started"

    saga_id: CorrelationId
    """The remediation's id (also the envelope's `correlationid`)."""
    unhealthy: dict[GpuUuid, tuple[Annotated[int, Field(ge=0, le=65535)], ...]] = Field(
        min_length=1, max_length=MAX_GPUS
    )
    """The unhealthy GPUs and the XIDs each reported (none for an ECC or unreachable
    fault)."""
    action: XidAction = XidAction.RESET_GPU
    """The worst action the faults asked for: `reboot` or worse skips the reset."""
    boot_id: BootId | None = None
    """The node's boot id when it started: a reboot is confirmed by another."""
    driver_version: Version | None = None
    """The GPU driver the node runs, which the validation ladder checks."""
    expected_devices: Count | None = None
    """GPUs validation must find; absent: any number."""
    folded_into: CorrelationId | None = None
    """The node's upgrade saga under way that the remediation folded into; absent: none."""
    dra_devices: dict[GpuUuid, tuple[DeviceName, ...]] = Field(default={}, max_length=MAX_GPUS)
    """Set when the node served its GPUs through DRA (its latest `device.api-applied` said
    `dra` and serving): each GPU's devices in the node's pool of gpuop's driver (`gpu-<minor>`,
    or its MIG devices). The remediation then quarantines the faulty GPUs' devices (a
    `DeviceTaintRule` each) instead of the node, so its other GPUs keep serving; empty: the
    node's quarantine."""
    slots: dict[GpuUuid, PciAddress] = Field(default_factory=dict, max_length=MAX_GPUS)
    """The PCI address of each unhealthy GPU the node's inventory listed: a replacement is
    confirmed by another GPU at that address."""
    signals: dict[GpuUuid, Token] = Field(default_factory=dict, max_length=MAX_GPUS)
    """The health catalog's signal that made each GPU unhealthy (`row-remap-failure`,
    `nvlink-errors`, `xid`, ...), where the health event named one: what a hand-over for
    replacement says besides the XIDs. Absent in logs written before signals were kept."""


class RemediationRefused(Event):
    """The circuit breaker refused the remediation a health event (the envelope's
    `causationid`) called for: the node stays as it is, its GPUs unremediated. Published once
    per refused health event, with an id derived from it, however often it is redelivered."""

    DOMAIN: ClassVar[str] = DOMAIN
    NAME: ClassVar[str] = "refused"

    unhealthy: dict[GpuUuid, tuple[Annotated[int, Field(ge=0, le=65535)], ...]] = Field(
        min_length=1, max_length=MAX_GPUS
    )
    """The unhealthy GPU and the XIDs it reported (none for an ECC or unreachable fault)."""
    action: XidAction = XidAction.RESET_GPU
    """The action the fault asked for."""
    starts: Count
    """Remediations started in the hour before (the breaker's sliding window)."""
    max_per_hour: Count
    """The limit in force (`remediation.maxPerHour`)."""
    reopens: AwareDatetime | None = None
    """When the breaker lets a start through again."""


class NodeRemediationStateChanged(StateChangedEvent):
    """A node's remediation moved to a new state; published on the subject of that state."""

    DOMAIN: ClassVar[str] = DOMAIN
    NAME: ClassVar[str] = "state-changed"

    saga_id: CorrelationId
    """The remediation (also the envelope's `correlationid`)."""
    from_state: RemediationState | None = None
    """State before the change."""
    to_state: RemediationState
    """State after the change: the last token of the subject."""
    reason: Message = ""
    """Why the saga moved, in words."""
    attempt: Attempt = 1
    """The remediation's attempt."""
    gpu_uuids: tuple[GpuUuid, ...] = Field(default=(), max_length=MAX_GPUS)
    """The GPUs being remediated."""
