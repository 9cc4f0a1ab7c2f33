"""The durable record of one node's MIG reconfiguration, kept as the upgrade's is.

One `MigSaga` per request: the orchestrator's runtime makes it with `new_saga` when a node's
`nvidia.com/mig.config` label names a config (`MigConfigRequested`), keeps it in KV beside
the node's other sagas, and folds every event of the node into it through
`gpuop.saga.mig.kind`. Everything needed to carry on after a crash is here: the plan (the
layouts requested and the one recorded at the start, `plans.MigPlan`), the pending step
with its deadline, what was done (operands paused, pods evicted, the apply sent) and so what
a failure must undo, and a request that came while this one ran (`queued`).

Frozen and JSON-serialisable (`to_json` / `from_json`), like `gpuop.saga.upgrade.records.NodeSaga`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from pydantic import AwareDatetime, Field

from gpuop.events.device import OperandService
from gpuop.events.fields import (
    Attempt,
    BootId,
    CorrelationId,
    DocumentedEnum,
    LabelValue,
    Message,
    MessageId,
    NamespacedName,
    NodeName,
    Record,
)
from gpuop.events.mig import MigPlan
from gpuop.saga.machine import StepResult, StoredRecord, Transition
from gpuop.saga.mig.states import MigState

HISTORY_LIMIT = 32
"""Step outcomes kept in the record (the event log keeps them all)."""
MAX_PODS = 1024


class MigStepKind(DocumentedEnum):
    """What a step of the reconfiguration waits for; its value is the step's token."""

    ADMISSION = "admission"
    """A slot under `maxUnavailable` (no deadline)."""
    OPERANDS_PAUSE = "operands-pause"
    """Every operand to confirm its pause."""
    LIST_HOLDERS = "list-holders"
    """The device plugin to name the pods holding the re-carved GPUs."""
    EVICT_HOLDERS = "evict-holders"
    """Those pods to be evicted and gone."""
    APPLY = "apply"
    """The driver-manager to apply the layouts and answer."""
    REBOOT = "reboot"
    """The node to come back with a new boot id, the pending MIG mode in force."""
    REAPPLY = "apply-after-reboot"
    """The driver-manager to apply the layouts again after the reboot (its own command id)."""
    VERIFY = "verify"
    """The answer compared with the request (no wait)."""
    RESTORE = "restore"
    """The driver-manager to apply the layouts recorded at the start."""
    OPERANDS_RESUME = "operands-resume"
    """Every operand to confirm its resume."""
    DONE = "done"
    """Final: the layout is in force."""
    FAILED = "failed"
    """Final: the request failed."""


class MigStep(Record):
    """The pending step."""

    kind: MigStepKind

    @property
    def token(self) -> str:
        """Names its deadline and, with the attempt, seeds the id of what it issues."""
        return self.kind.value


class MigOutcome(Record):
    """One ended step, for operators and the record's audit trail."""

    at: AwareDatetime
    state: MigState
    step: MigStepKind
    result: StepResult
    detail: Message = ""


class MigFailure(Record):
    """Why the request failed; set while compensating and in mig-config-failed."""

    state: MigState
    """The state whose step failed."""
    step: MigStepKind
    """The step that failed."""
    reason: Message
    """Why, in words: it ends up in the node's Event and the public state change."""
    at: AwareDatetime


class AppliedAnswer(Record):
    """What the driver-manager reported of an apply that it says succeeded."""

    config: str = Field(max_length=63)
    """The config it applied."""
    changed_gpus: tuple[int, ...] = Field(default=(), max_length=64)
    """The GPUs whose layout changed, by index."""
    mig_devices: int = Field(ge=0, le=1024)
    """MIG devices on the node afterwards (its CDI spec names them)."""


class MigSaga(StoredRecord):
    """Where one node's MIG reconfiguration stands, durable across any crash."""

    saga_id: CorrelationId
    """`saga_id_for(request_id, node)`: the correlation id and the seed of every id."""
    node: NodeName
    request_id: MessageId
    """Envelope id of the `MigConfigRequested` that started it."""
    plan: MigPlan
    """The layouts requested and the one recorded at the start (`plans`)."""
    state: MigState = MigState.MIG_CONFIG_REQUIRED
    attempt: Attempt = 1
    """Always 1: a failed request is not retried (a new label value is a new request)."""
    step: MigStep = MigStep(kind=MigStepKind.ADMISSION)
    step_started: AwareDatetime
    deadline: AwareDatetime | None = None
    """When the pending step fails; None: no time limit (admission, the final states)."""
    operands: tuple[OperandService, ...] = tuple(OperandService)
    """Operand services on the node that must confirm a pause."""
    paused: tuple[OperandService, ...] = ()
    """Operands that confirmed the pending pause."""
    resumed: tuple[OperandService, ...] = ()
    """Operands that confirmed the pending resume."""
    operands_paused: bool = False
    """A pause was sent and no resume confirmed since: a failure must resume them."""
    holders: tuple[NamespacedName, ...] = Field(default=(), max_length=MAX_PODS)
    """The pods the device plugin named as holding the re-carved GPUs (evicted)."""
    boot_id: BootId | None = None
    """The node's boot id, as last seen (not while a reboot is awaited)."""
    boot_id_at_reboot: BootId | None = None
    """The boot id the reboot was decided in: only another confirms it."""
    rebooted: bool = False
    """The node rebooted for a pending MIG mode (once per reconfiguration)."""
    applied: bool = False
    """`ApplyMigLayout` was sent: the GPUs may have changed, a failure must restore."""
    restored: bool | None = None
    """After a failure past the apply: whether the layout recorded at the start is back
    (by the driver-manager's own restore, or the saga's); None: nothing to restore."""
    answer: AppliedAnswer | None = None
    """The driver-manager's `MigLayoutApplied`, as verification reads it."""
    failure: MigFailure | None = None
    """Why the request failed, while compensating and in mig-config-failed."""
    queued: LabelValue | None = None
    """A config the label named while this saga ran: started once this one ends, never
    interleaved with it (None: none; the latest request wins)."""
    sequence: int = Field(default=0, ge=0)
    """Transitions made so far; seeds the ids of labels and Kubernetes Events."""
    last_transitions: tuple[Transition[MigState], ...] = Field(default=(), max_length=16)
    """The transitions of the latest decision that made any (republished by a new leader)."""
    history: tuple[MigOutcome, ...] = Field(default=(), max_length=HISTORY_LIMIT)
    """The latest step outcomes, oldest first."""

    @property
    def config(self) -> str:
        """The config requested."""
        return self.plan.config

    def ended(self, at: datetime, result: str, detail: str) -> MigSaga:
        """This record with the pending step's outcome appended to its bounded history."""
        outcome = MigOutcome(
            at=at,
            state=self.state,
            step=self.step.kind,
            result=StepResult(result),
            detail=detail[:2048],
        )
        return self.model_copy(update={"history": (*self.history, outcome)[-HISTORY_LIMIT:]})


def saga_id_for(request_id: str, node: str) -> str:
    """The saga id of the request `request_id` on `node`: each request its own, so no
    command id of one request repeats another's."""
    return f"mig-{request_id}/{node}"


def new_saga(
    *,
    node: str,
    request_id: str,
    plan: MigPlan,
    now: datetime,
    operands: Iterable[OperandService] = tuple(OperandService),
    boot_id: str | None = None,
) -> MigSaga:
    """The first record of the request `request_id` for `plan.config` on `node`, waiting
    for admission; its first decision (`kind.begin`) fails it at once when `plan` has a
    problem, or ends it when no GPU changes."""
    return MigSaga(
        saga_id=saga_id_for(request_id, node),
        node=node,
        request_id=request_id,
        plan=plan,
        step_started=now,
        operands=tuple(dict.fromkeys(operands)),
        boot_id=boot_id,
    )
