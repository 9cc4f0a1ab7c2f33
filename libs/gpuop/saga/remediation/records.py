"""The durable record of one node's GPU remediation, kept in `gpuop_sagas` under the key
`remediation.<node token>` (`gpuop.services.upgrade_orchestrator.kinds`).

Frozen, JSON; `start` builds the first record from its `RemediationStarted` (the runtime
and `gpuop replay` alike). Everything the phases need after a crash is here: the state and
the pending step with its deadline, the GPUs and the XIDs they reported, the pods that held
them, whether the operands are paused, the boot id a reboot must change, and on a node
serving through DRA its GPUs' devices and those the quarantine tainted.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import AwareDatetime, Field

from gpuop.events.device import OperandService, XidAction
from gpuop.events.dra import DeviceName
from gpuop.events.fields import (
    Attempt,
    BootId,
    CorrelationId,
    Count,
    GpuUuid,
    Message,
    NamespacedName,
    NodeName,
    Record,
    Token,
    Version,
)
from gpuop.events.hardware import PciAddress
from gpuop.events.remediation import MAX_GPUS, RemediationStarted, RemediationState
from gpuop.saga.machine import StoredRecord, Transition

HISTORY_LIMIT = 32
"""Step outcomes kept in the record (the event log keeps them all)."""
Xids = tuple[int, ...]


class Step(Record):
    """The pending step: its token names its deadline and seeds its ids."""

    name: Token
    """`holders`, `evict`, `operands-pause`, `reset`, `reboot`, `validate-gpu`, ..."""

    @property
    def token(self) -> str:
        return self.name


class Outcome(Record):
    """One ended step."""

    at: AwareDatetime
    state: RemediationState
    step: Token
    result: Token
    """`succeeded`, `failed`, `expired`, `skipped`."""
    detail: Message = ""


class RemediationSaga(StoredRecord):
    """Where one node's GPU remediation stands, durable across any crash."""

    saga_id: CorrelationId
    node: NodeName
    state: RemediationState = RemediationState.ADMISSION_REQUIRED
    attempt: Attempt = 1
    sequence: int = Field(default=0, ge=0)
    step: Step = Step(name="admission")
    step_started: AwareDatetime
    deadline: AwareDatetime | None = None
    started_at: AwareDatetime
    """When it started: counted by the circuit breaker for an hour."""
    earlier_starts: tuple[AwareDatetime, ...] = Field(default=(), max_length=100)
    """The node's earlier remediations' starts within the hour before this one's, kept for
    the circuit breaker (this record replaced theirs)."""
    unhealthy: dict[GpuUuid, Xids] = Field(min_length=1, max_length=MAX_GPUS)
    """The unhealthy GPUs and their XIDs, for the condition's message."""
    gpu_uuids: tuple[GpuUuid, ...] = Field(min_length=1, max_length=MAX_GPUS)
    """The GPUs to reset, sorted."""
    action: XidAction = XidAction.RESET_GPU
    """The worst action the faults asked for."""
    boot_id: BootId | None = None
    boot_id_at_reboot: BootId | None = None
    driver_version: Version | None = None
    expected_devices: Count | None = None
    folded_into: CorrelationId | None = None
    """The node's upgrade saga whose reload and validation serve."""
    dra_devices: dict[GpuUuid, tuple[DeviceName, ...]] = Field(default={}, max_length=MAX_GPUS)
    """On a node serving its GPUs through DRA, each GPU's devices in its pool: the quarantine
    taints the faulty GPUs' devices, not the node (`device_quarantine`)."""
    quarantined_devices: tuple[DeviceName, ...] = Field(default=(), max_length=512)
    """The devices this remediation tainted (a DeviceTaintRule each) and not yet released,
    sorted: the release deletes exactly these."""
    holders: tuple[NamespacedName, ...] = Field(default=(), max_length=1024)
    """The pods the device plugin named as holding the GPUs."""
    holders_unknown: bool = False
    """The device plugin could not name them: every GPU pod of the node is evicted."""
    operands: tuple[OperandService, ...] = tuple(OperandService)
    paused: tuple[OperandService, ...] = ()
    """Operands that confirmed the pending pause (or resume)."""
    operands_paused: bool = False
    """A pause was sent and no resume since."""
    rebooted: bool = False
    slots: dict[GpuUuid, PciAddress] = Field(default_factory=dict, max_length=MAX_GPUS)
    """The PCI address of each unhealthy GPU, from the inventories seen."""
    signals: dict[GpuUuid, Token] = Field(default_factory=dict, max_length=MAX_GPUS)
    """The health signal that made each GPU unhealthy, where its event named one."""
    inventory: dict[PciAddress, GpuUuid] | None = Field(default=None, max_length=MAX_GPUS)
    """The GPUs the node's last inventory listed, by PCI address; None before one is seen."""
    cordoned_before: bool = False
    """The node was cordoned before the hand-over cordoned it: the release leaves it so."""
    release_refusals: int = Field(default=0, ge=0)
    """Releases of a node held for replacement refused because the hardware had not changed."""
    failure: Message = ""
    """Why it failed, in remediation-failed."""
    last_transitions: tuple[Transition[RemediationState], ...] = Field(default=(), max_length=32)
    history: tuple[Outcome, ...] = Field(default=(), max_length=HISTORY_LIMIT)

    @property
    def device_quarantine(self) -> bool:
        """Whether the quarantine is of devices (DRA), not of the node."""
        return bool(self.dra_devices)

    def quarantining(self) -> tuple[str, ...]:
        """`quarantined_devices` with the devices of the GPUs to reset added."""
        found = set(self.quarantined_devices)
        for gpu in self.gpu_uuids:
            found.update(self.dra_devices.get(gpu, ()))
        return tuple(sorted(found))

    def ended(self, at: datetime, result: str, detail: str) -> RemediationSaga:
        outcome = Outcome(
            at=at, state=self.state, step=self.step.token, result=str(result), detail=detail
        )
        return self.model_copy(update={"history": (*self.history, outcome)[-HISTORY_LIMIT:]})


def saga_id_for(node: str, now: datetime) -> str:
    """A new remediation's id: its own per start, so no command id repeats an earlier one's."""
    return f"remediation/{node}/{int(now.timestamp())}"


def starts(saga: RemediationSaga) -> tuple[datetime, ...]:
    """Every start the record keeps for the circuit breaker."""
    return (*saga.earlier_starts, saga.started_at)


def start(node: str, started: RemediationStarted, now: datetime) -> RemediationSaga:
    """The first record of the remediation `started` began at `now`: quarantined, waiting
    for its admission, or folded into the node's upgrade."""
    folded = started.folded_into is not None
    saga = RemediationSaga(
        saga_id=started.saga_id,
        node=node,
        state=RemediationState.FOLDED if folded else RemediationState.ADMISSION_REQUIRED,
        step=Step(name="folded" if folded else "admission"),
        step_started=now,
        started_at=now,
        unhealthy=dict(started.unhealthy),
        gpu_uuids=tuple(sorted(started.unhealthy)),
        action=started.action,
        boot_id=started.boot_id,
        driver_version=started.driver_version,
        expected_devices=started.expected_devices,
        folded_into=started.folded_into,
        dra_devices=dict(started.dra_devices),
        slots=dict(started.slots),
        signals=dict(started.signals),
    )
    return saga.model_copy(update={"quarantined_devices": saga.quarantining()})


def start_of(saga: RemediationSaga) -> RemediationStarted:
    """The `RemediationStarted` that `start` rebuilds `saga` from, as it was first stored."""
    return RemediationStarted(
        saga_id=saga.saga_id,
        unhealthy=dict(saga.unhealthy),
        action=saga.action,
        boot_id=saga.boot_id,
        driver_version=saga.driver_version,
        expected_devices=saga.expected_devices,
        folded_into=saga.folded_into,
        dra_devices=dict(saga.dra_devices),
        slots=dict(saga.slots),
        signals=dict(saga.signals),
    )
