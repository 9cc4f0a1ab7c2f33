"""The durable record of one node's device-API switch, kept as the other kinds' are.

One `DeviceApiSaga` per switch: the orchestrator's runtime makes it with `new_saga` when
the policy's `deviceAPI` for a node differs from what its device plugin serves, keeps it in
KV beside the node's other sagas, and folds every event of the node into it through
`gpuop.saga.device_api.kind`. Everything needed to carry on after a crash is here: the API
wanted and the one served at the start, the pending step with its deadline, what was done
(cordoned, `SetDeviceApi` sent) and so what a failure must undo.

Frozen and JSON-serialisable (`machine.StoredRecord`).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import AwareDatetime, Field

from gpuop.events.device_api import DeviceApiState
from gpuop.events.device_api_commands import DeviceApi
from gpuop.events.fields import (
    Attempt,
    CorrelationId,
    DocumentedEnum,
    Message,
    NodeName,
    Record,
)
from gpuop.saga.machine import StepResult, StoredRecord, Transition

HISTORY_LIMIT = 32
"""Step outcomes kept in the record (the event log keeps them all)."""


class SwitchStepKind(DocumentedEnum):
    """What a step of the switch waits for; its value is the step's token."""

    ADMISSION = "admission"
    """A slot under `maxUnavailable` (no deadline)."""
    CORDON = "cordon"
    """The node to be unschedulable."""
    DRAIN = "drain"
    """The pods holding the node's GPUs to be evicted and gone."""
    SWITCH = "switch"
    """The device plugin to serve the API wanted and say so."""
    VALIDATE = "validate"
    """The validation pod, given a GPU through the new API, to succeed."""
    SWITCH_BACK = "switch-back"
    """The device plugin to serve the API of the start again."""
    UNCORDON = "uncordon"
    """The node to be schedulable again."""
    DONE = "done"
    """Final: the node serves the API wanted."""
    FAILED = "failed"
    """Final: the switch failed."""


class SwitchStep(Record):
    """The pending step."""

    kind: SwitchStepKind

    @property
    def token(self) -> str:
        """Names its deadline and, with the attempt, seeds the id of what it issues."""
        return self.kind.value


class SwitchOutcome(Record):
    """One ended step, for operators and the record's audit trail."""

    at: AwareDatetime
    state: DeviceApiState
    step: SwitchStepKind
    result: StepResult
    detail: Message = ""


class SwitchFailure(Record):
    """Why the switch failed; set while compensating and in device-api-failed."""

    state: DeviceApiState
    step: SwitchStepKind
    reason: Message
    at: AwareDatetime


class DeviceApiSaga(StoredRecord):
    """Where one node's device-API switch stands, durable across any crash."""

    saga_id: CorrelationId
    """`saga_id_for(cause, node)`: the correlation id and the seed of every id."""
    node: NodeName
    api: DeviceApi
    """The API the node is to serve."""
    previous: DeviceApi
    """The API the node served at the start: what a failure switches back to."""
    reason: Message = ""
    """Why the switch started, in words."""
    state: DeviceApiState = DeviceApiState.SWITCH_REQUIRED
    attempt: Attempt = 1
    """Always 1: a failed switch is not retried by itself."""
    step: SwitchStep = SwitchStep(kind=SwitchStepKind.ADMISSION)
    step_started: AwareDatetime
    deadline: AwareDatetime | None = None
    """When the pending step fails; None: no time limit (admission, the final states)."""
    cordoned: bool = False
    """The saga's cordon was confirmed: the end uncordons, unless `was_unschedulable`."""
    was_unschedulable: bool = False
    """The node was cordoned before the switch (by someone else): it stays so."""
    switched: bool = False
    """`SetDeviceApi` was sent: a failure must switch back."""
    switched_back: bool | None = None
    """After a failure past the switch: whether the API of the start is served again."""
    failure: SwitchFailure | None = None
    """Why the switch failed, while compensating and in device-api-failed."""
    sequence: int = Field(default=0, ge=0)
    """Transitions made so far; seeds the ids of Kubernetes Events."""
    last_transitions: tuple[Transition[DeviceApiState], ...] = Field(default=(), max_length=16)
    """The transitions of the latest decision that made any (republished by a new leader)."""
    history: tuple[SwitchOutcome, ...] = Field(default=(), max_length=HISTORY_LIMIT)
    """The latest step outcomes, oldest first."""

    def ended(self, at: datetime, result: str, detail: str) -> DeviceApiSaga:
        """This record with the pending step's outcome appended to its bounded history."""
        outcome = SwitchOutcome(
            at=at,
            state=self.state,
            step=self.step.kind,
            result=StepResult(result),
            detail=detail[:2048],
        )
        return self.model_copy(update={"history": (*self.history, outcome)[-HISTORY_LIMIT:]})


def saga_id_for(cause: str, node: str) -> str:
    """The saga id of the switch `cause` (the envelope id of the event that started it)
    started on `node`: each switch its own, so no command id of one repeats another's."""
    return f"device-api-{cause}/{node}"


def new_saga(
    *, node: str, cause: str, api: DeviceApi, previous: DeviceApi, now: datetime, reason: str = ""
) -> DeviceApiSaga:
    """The first record of a switch of `node` from `previous` to `api`, waiting for its
    admission."""
    return DeviceApiSaga(
        saga_id=saga_id_for(cause, node),
        node=node,
        api=api,
        previous=previous,
        reason=reason[:2048],
        step_started=now,
    )


__all__ = [
    "DeviceApiSaga",
    "StepResult",
    "SwitchFailure",
    "SwitchOutcome",
    "SwitchStep",
    "SwitchStepKind",
    "new_saga",
    "saga_id_for",
]
