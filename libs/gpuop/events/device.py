"""GPU health, and the pause that makes node operands let go of the GPUs.

`DeviceHealthChanged` is published by telemetry when NVML reports an XID or an ECC error on a
GPU, or when a GPU recovers. The device plugin consumes it to mark the device unhealthy for the
kubelet; the upgrade orchestrator may consume it to judge validation and to remediate.
Telemetry owns the decision of what a fault asks for: each event carries an `XidAction` from
gpuop's XID catalog (`gpuop.health.xids`); consumers act on it and never map XIDs themselves.

A kernel module cannot be unloaded while anything holds `/dev/nvidia*`. So before a driver
reload, the upgrade orchestrator sends `PauseOperands` to the service group `operands` on the
node (`gpuop.cmd.operands.<node>.pause`): every operand service there (device plugin,
telemetry, discovery) consumes it, releases its device handles, and confirms with its own
`OperandPaused`. `ResumeOperands` / `OperandResumed` undo it after validation or on
compensation. The orchestrator waits until every operand the policy deploys has confirmed.

The device plugin's named configs are selected per node by the Node label
`nvidia.com/device-plugin.config`, as upstream's. Node agents hold no Kubernetes credentials,
so discovery's cluster role, which watches the Nodes, publishes `DevicePluginConfigSelected`
whenever a node's label changes; that node's device plugin switches to the config it names
and answers with `DevicePluginConfigApplied`, the config now in force, from which the
labeler derives the node's `nvidia.com/gpu.replicas`, `gpu.sharing-strategy`,
`mps.capable` and `gpu.product` labels. Under MPS sharing the plugin also runs the node's MPS
control daemons and reports each one's start, stop and failure with `MpsDaemonChanged`.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from gpuop.events.driver import Component
from gpuop.events.envelope import Command, Event
from gpuop.events.fields import (
    Count,
    DocumentedEnum,
    GpuUuid,
    LabelKey,
    LabelValue,
    Message,
    MessageId,
    Token,
)

OPERANDS = "operands"
"""Command group that every operand service on a node subscribes to."""
PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
"""The Node label that names the device plugin config a node runs, as upstream's."""


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
    NVLINK = "nvlink"
    """NVLink CRC, replay or recovery errors rose past the health catalog's rate."""
    CLOCKS = "clocks"
    """Thermal or power slowdown held the clocks down past the health catalog's time."""
    PCIE = "pcie"
    """PCIe replays rose past the catalog's rate, or the link runs below its maximum."""
    ROW_REMAP = "row-remap"
    """A row remap is pending (a reset applies it) or failed (the memory needs replacing)."""
    RECOVERED = "recovered"
    """The GPU answers again and no longer reports the error."""


class XidAction(DocumentedEnum):
    """What a GPU fault asks of the operator, in escalation order (each step includes what
    the ones before it would do): NVIDIA's XID catalog resolution buckets, as gpuop acts on
    them (`gpuop.health.xids` maps every XID to one)."""

    NONE = "none"
    """Informational: the GPU stays healthy and in service."""
    RESTART_APPLICATION = "restart-application"
    """The application that hit it is at fault; the GPU stays healthy, the job restarts."""
    MARK = "mark"
    """Unhealthy (no new work lands on it) while the fault lasts, but nothing is remediated."""
    RESET_GPU = "reset-gpu"
    """The GPU must be reset (its processes stopped first); a reset that fails reboots."""
    REBOOT = "reboot"
    """The node must be rebooted: the GPU cannot be reset alone (e.g. it fell off the bus)."""
    DRAIN_AND_REPLACE = "drain-and-replace"
    """The hardware needs a person: drain the node and leave it out of service."""

    @property
    def keeps_gpu_healthy(self) -> bool:
        """Whether a GPU that reports a fault with this action stays in service."""
        return self in (XidAction.NONE, XidAction.RESTART_APPLICATION)

    @property
    def rank(self) -> int:
        """Position in the escalation order, from 0 (`none`)."""
        return list(XidAction).index(self)


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
    action: XidAction | None = None
    """What the fault asks for, as telemetry decided it: the catalog's action for an XID,
    `reset-gpu` for uncorrectable ECC errors, `reboot` for an unreachable GPU, `none` on
    recovery. None in events written before telemetry decided it: read it as `reset-gpu`
    when `healthy` is false (`effective_action`)."""
    signal: Token | None = None
    """The health catalog's name of the signal that decided `action` (`nvlink-errors`,
    `row-remap-failure`, `xid`, ...); None in events written before signals were named."""
    message: Message = ""
    """Detail for operators: what was seen, and the catalog's reason for the action."""

    @property
    def effective_action(self) -> XidAction:
        """`action`, or what an event from an older log meant: `reset-gpu` when unhealthy."""
        if self.action is not None:
            return self.action
        return XidAction.NONE if self.healthy else XidAction.RESET_GPU


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


class ConfigOutcome(DocumentedEnum):
    """How the device plugin answered a node's config selection."""

    SELECTED = "selected"
    """The label names one of the configs: that one is in force."""
    DEFAULT = "default"
    """The node has no label: the default config is in force."""
    UNKNOWN = "unknown"
    """The label names no config of the file: the default config is in force."""
    REFUSED = "refused"
    """The `--config` file, read again for the switch, does not validate: nothing changed."""


class SharingStrategy(DocumentedEnum):
    """How the config in force shares each GPU, as GPU Feature Discovery labels it."""

    NONE = "none"
    """Every device id is a whole GPU (or MIG device)."""
    TIME_SLICING = "time-slicing"
    """Each GPU is advertised `replicas` times; containers take turns on it."""
    MPS = "mps"
    """Each GPU is advertised `replicas` times; containers run on it at once through MPS."""


class DevicePluginConfigSelected(Event):
    """The node's `nvidia.com/device-plugin.config` label changed (published by discovery's
    cluster role, which watches the Nodes)."""

    DOMAIN: ClassVar[str] = "device"
    NAME: ClassVar[str] = "plugin-config-selected"

    config: LabelValue | None = None
    """The label's value; None when the node has no such label (the default config)."""


class DevicePluginConfigApplied(Event):
    """The device plugin config in force on the node after a selection, or at start."""

    DOMAIN: ClassVar[str] = "device"
    NAME: ClassVar[str] = "plugin-config-applied"

    config: Token
    """Name of the config in force (`default` for a file that holds a single config)."""
    requested: LabelValue | None = None
    """The label value it answers; None when the node has no label."""
    outcome: ConfigOutcome
    """Whether the label's config, the default, or the previous config is in force."""
    replicas: Annotated[int, Field(ge=1, le=1024)] = 1
    """Replicas of each `nvidia.com/gpu` device (time-sliced or MPS) under the config in
    force."""
    sharing_strategy: SharingStrategy = SharingStrategy.NONE
    """How the config in force shares `nvidia.com/gpu`."""
    renamed: bool = False
    """The shared GPUs are advertised as `nvidia.com/gpu.shared` (`renameByDefault`)."""
    message: Message = ""
    """Why the label's config is not the one in force, when it is not."""


class MpsDaemonState(DocumentedEnum):
    """Where an MPS control daemon the device plugin runs stands."""

    RUNNING = "running"
    """Started, its client limits set, answering on its control pipe."""
    STOPPED = "stopped"
    """Quit: its GPUs are paused for a reload, no longer shared with MPS, or the plugin stops."""
    FAILED = "failed"
    """Not started, or stopped answering: started again with backoff, its replicas Unhealthy."""


class MpsDaemonChanged(Event):
    """An MPS control daemon of the node's device plugin started, stopped or failed.

    The daemon is `nvidia-cuda-mps-control`, one per MPS-shared resource."""

    DOMAIN: ClassVar[str] = "device"
    NAME: ClassVar[str] = "mps-daemon-changed"

    resource: LabelKey
    """The resource whose replicas are its clients: `nvidia.com/gpu`."""
    state: MpsDaemonState
    """Where it stands now."""
    replicas: Annotated[int, Field(ge=2, le=1024)]
    """Clients per GPU."""
    gpus: Count = 0
    """GPUs it shares."""
    restarts: Count = 0
    """Starts after a failure since the plugin started."""
    message: Message = ""
    """Why it stopped or failed (for a missing program: what to install)."""
