"""The GPU remediation as a saga kind: its table, phases and hooks, handed to the machinery,
and the fold the runtime and `gpuop replay` share.

    inbound    the events a remediation decides: a GPU's health, the holders' listing, the
               reset's answer, operand confirmations, driver validations, Kubernetes
               outcomes and observations, inventories (boot id), deadlines, admissions,
               and the node's upgrade moves (a folded remediation ends with them)
    step       one decision, or None when the saga is left as it was
    outputs    a decision's public state changes, then its commands, with their ids
    pending    what a stored saga issues again after a crash
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gpuop.events import Event, ids, kube
from gpuop.events import device as dev
from gpuop.events import driver as dm
from gpuop.events import hardware as hw
from gpuop.events import remediation_commands as cmd
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.remediation import TERMINAL_STATES, NodeRemediationStateChanged
from gpuop.events.remediation import RemediationState as S
from gpuop.events.upgrade import NodeAdmitted, NodeUpgradeStateChanged
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import machine
from gpuop.saga.machine import Admitted, IssuedCommand, Kind, StepLike, Trigger
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


def _removed(draft: Draft) -> None:
    if draft.saga.state not in TERMINAL_STATES:
        draft.update(failure="the node was removed")
        draft.move(S.FAILED, "the node was removed", retry=False)


def _limit(saga: RemediationSaga, step: StepLike, spec: GPUClusterPolicySpec) -> float | None:
    if not isinstance(step, Step):
        raise TypeError(f"a remediation step is a Step, not {type(step).__name__}")
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
)
"""GPU health remediation, the second saga kind."""
REMEDIATION.check()


_INBOUND = (
    dev.DeviceHealthChanged,
    dev.OperandPaused,
    dev.OperandResumed,
    cmd.GpuHoldersListed,
    cmd.GpuHoldersUnknown,
    cmd.GpuReset,
    cmd.GpuResetFailed,
    dm.DriverValidated,
    dm.DriverValidationFailed,
    hw.HardwareDiscovered,
    DeadlineExpired,
    NodeAdmitted,
    NodeUpgradeStateChanged,
)
FOLDING_STATES = ("uncordon-required", "upgrade-done", "upgrade-failed")
"""The upgrade's moves a folded remediation reads (the subjects' last token)."""


def is_inbound(event: Event) -> bool:
    """Whether the remediation's fold consumes `event`."""
    if isinstance(event, NodeUpgradeStateChanged):
        return event.to_state.value in FOLDING_STATES
    return isinstance(event, _INBOUND) or event.DOMAIN == kube.DOMAIN


def trigger(saga: RemediationSaga, event: Event) -> Trigger | None:
    """What `event` means to `saga`: `Admitted` for its own admission, else the event."""
    if not isinstance(event, NodeAdmitted):
        return event
    if (event.saga_id, event.attempt) != (saga.saga_id, saga.attempt):
        return None
    return Admitted()


def decide(
    saga: RemediationSaga, event: Trigger, spec: GPUClusterPolicySpec, now: datetime
) -> Decision:
    return machine.decide(Draft(REMEDIATION, saga, spec, now), event).decision()


def step(
    saga: RemediationSaga, event: Event, spec: GPUClusterPolicySpec, now: datetime
) -> Decision | None:
    """Decide `event` for `saga` at `now`: the decision, or None when nothing changed."""
    if not is_inbound(event):
        return None
    meaning = trigger(saga, event)
    if meaning is None:
        return None
    decision = decide(saga, meaning, spec, now)
    return None if decision.saga == saga else decision


@dataclass(frozen=True)
class StateChange:
    """A public state change with the id that makes a republished one a duplicate."""

    id: str
    payload: NodeRemediationStateChanged


def state_changed(
    saga: RemediationSaga, transition: machine.Transition[S]
) -> NodeRemediationStateChanged:
    return NodeRemediationStateChanged(
        saga_id=saga.saga_id,
        from_state=transition.from_state,
        to_state=transition.to_state,
        reason=transition.reason[:2048],
        attempt=transition.attempt,
        gpu_uuids=saga.gpu_uuids,
    )


def outputs(decision: machine.Decision[RemediationSaga, S]) -> list[StateChange | IssuedCommand]:
    """The decision's state changes, then its commands (the outbox's order)."""
    saga = decision.saga
    first = saga.sequence - len(decision.transitions) + 1
    changes: list[StateChange | IssuedCommand] = [
        StateChange(ids.transition(saga.saga_id, first + n), state_changed(saga, transition))
        for n, transition in enumerate(decision.transitions)
    ]
    return changes + list(decision.commands)


def pending(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Decision:
    """What to issue again for a saga read back after a crash (the same ids)."""
    commands, actions = REMEDIATION.effects(saga, spec)
    return machine.Decision(
        saga=saga, commands=commands, kube_actions=actions, transitions=saga.last_transitions
    )


def holds(saga: RemediationSaga) -> bool:
    """The remediation holds its node (admitted, not ended, not folded)."""
    return saga.state not in (*TERMINAL_STATES, S.ADMISSION_REQUIRED, S.FOLDED)


def waiting(saga: RemediationSaga) -> bool:
    return saga.state is S.ADMISSION_REQUIRED


def leftover(saga: RemediationSaga) -> dict[str, tuple[int, ...]]:
    """GPUs that failed after the remediation had asked which pods hold its GPUs: this
    attempt does not reset them; the next one (from its admission) does."""
    return {gpu: xids for gpu, xids in saga.unhealthy.items() if gpu not in saga.gpu_uuids}
