"""The GPU remediation as a saga kind: its table, phases and hooks, handed to the machinery.

    calls_for_remediation  whether a health event asks for a remediation
    REMEDIATION            the Kind: table, phases, observe, removed, announce, limit
    decide                 one decision of the machinery for a remediation
    pending                what a stored saga issues again after a crash
    leftover               GPUs that failed after this attempt asked for the holders

Its fold, shared by the runtime and `gpuop replay`, is `folding`.
"""

from __future__ import annotations

from datetime import datetime

from gpuop.events import Event, kube
from gpuop.events import device as dev
from gpuop.events import hardware as hw
from gpuop.events.remediation import TERMINAL_STATES
from gpuop.events.remediation import RemediationState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import machine
from gpuop.saga.machine import Kind, Trigger
from gpuop.saga.remediation.drafting import Draft, announce
from gpuop.saga.remediation.phases import PHASES, limit_seconds
from gpuop.saga.remediation.records import RemediationSaga, Step
from gpuop.saga.remediation.table import TABLE

NAME = "gpu-remediation"

Decision = machine.Decision[RemediationSaga, S]


def calls_for_remediation(event: Event) -> bool:
    """Whether a health event asks for a remediation: unhealthy, with an action of
    `reset-gpu` or worse (an old log's, without one, means `reset-gpu`)."""
    if not isinstance(event, dev.DeviceHealthChanged) or event.healthy:
        return False
    return event.effective_action.rank >= dev.XidAction.RESET_GPU.rank


def _observe(draft: Draft, event: Event) -> None:
    saga = draft.saga
    if saga.state in TERMINAL_STATES:
        return
    if (
        isinstance(event, kube.NodeObserved | hw.HardwareDiscovered)
        and event.boot_id
        and saga.state is not S.REBOOT_REQUIRED
    ):
        draft.update(boot_id=event.boot_id)
    if isinstance(event, hw.HardwareDiscovered):
        draft.update(inventory={gpu.pci_bus_id: gpu.uuid for gpu in event.gpus})
    if calls_for_remediation(event):
        assert isinstance(event, dev.DeviceHealthChanged)
        xids = saga.unhealthy.get(event.gpu_uuid, ())
        if event.xid is not None and event.xid not in xids:
            xids = (*xids, event.xid)
        unhealthy = {**saga.unhealthy, event.gpu_uuid: xids}
        update: dict[str, object] = {"unhealthy": unhealthy}
        if saga.state in (S.ADMISSION_REQUIRED, S.FOLDED):  # not asked about yet: reset it
            update["gpu_uuids"] = tuple(sorted(unhealthy))
        draft.update(**update)
        if saga.state in (S.ADMISSION_REQUIRED, S.FOLDED):  # and quarantine its devices
            draft.update(quarantined_devices=draft.saga.quarantining())


def _removed(draft: Draft) -> None:
    if draft.saga.state not in TERMINAL_STATES:
        draft.update(failure="the node was removed")
        draft.move(S.FAILED, "the node was removed", retry=False)


def _limit(saga: RemediationSaga, step: Step, spec: GPUClusterPolicySpec) -> float | None:
    return limit_seconds(saga, step, spec)


REMEDIATION: Kind[RemediationSaga, S, Draft] = Kind(
    name=NAME,
    table=TABLE,
    phases=PHASES,
    retry_state=S.ADMISSION_REQUIRED,
    observe=_observe,
    removed=_removed,
    announce=announce,
    limit=_limit,
    step_type=Step,
)
"""GPU health remediation, the second saga kind."""
REMEDIATION.check()


def decide(
    saga: RemediationSaga, event: Trigger, spec: GPUClusterPolicySpec, now: datetime
) -> Decision:
    return machine.decide(Draft(REMEDIATION, saga, spec, now), event).decision()


def pending(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Decision:
    """What to issue again for a saga read back after a crash (the same ids)."""
    return REMEDIATION.pending(saga, spec)


def leftover(saga: RemediationSaga) -> dict[str, tuple[int, ...]]:
    """GPUs that failed after the remediation had asked which pods hold its GPUs: this
    attempt does not reset them; the next one (from its admission) does."""
    return {gpu: xids for gpu, xids in saga.unhealthy.items() if gpu not in saga.gpu_uuids}
