"""One fold from the log to decisions: what the runtime and `gpuop replay` both do with an
event, written once, so that a replay equals the runtime by construction.

    inbound    which events the orchestrator's intake consumes (`INBOUND_DOMAINS`,
               `INBOUND_TYPES`; the intake builds its subject filters from them)
    trigger    what an inbound event means to a node's saga (`NodeAdmitted` becomes
               `Admitted` for the saga and attempt it names, with the components it lets
               the saga upgrade, or nothing)
    started    a saga built from its `SagaStarted`, and the `SagaStarted` of a new saga
    step       one decision, or None when the saga is left as it was
    outputs    a decision's state changes and commands, in publishing order, with their ids

Pure: no bus, no clock, no I/O (the saga core's import contract holds here too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from gpuop.events import Event, Payload, kube
from gpuop.events import device as dev
from gpuop.events import hardware as hw
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.driver import Component
from gpuop.events.upgrade import NodeAdmitted, NodeUpgradeStateChanged, SagaStarted
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.actions import Decision, IssuedCommand
from gpuop.saga.core import Admitted, Trigger, decide, state_changed, transition_event_id
from gpuop.saga.records import NodeSaga, new_saga

INBOUND_DOMAINS = (kube.DOMAIN, "driver")
"""Every event of these domains: the orchestrator's own Kubernetes observations and action
outcomes, and the driver-manager's results."""
INBOUND_TYPES: tuple[type[Event], ...] = (
    dev.OperandPaused,
    dev.OperandResumed,
    hw.HardwareDiscovered,
    DeadlineExpired,
    NodeAdmitted,
)
"""And these: operand pause and resume confirmations (the validation ladder's pod rung waits
for the resume), inventories (boot id, running versions), expired deadlines and recorded
admissions. The public state changes are outputs, never read back."""


def is_inbound(payload: Payload) -> bool:
    """Whether the orchestrator's intake consumes `payload`."""
    if isinstance(payload, Event) and payload.DOMAIN in INBOUND_DOMAINS:
        return True
    return isinstance(payload, INBOUND_TYPES)


def trigger(saga: NodeSaga, event: Event) -> Trigger | None:
    """What `event` means to `saga`: itself, `Admitted` for an admission of this saga's
    attempt, None for an admission of an earlier rollout or attempt."""
    if not isinstance(event, NodeAdmitted):
        return event
    if (event.saga_id, event.attempt) != (saga.saga_id, saga.attempt):
        return None
    return Admitted(canary=event.canary, components=event.components)


def started_saga(
    node: str, started: SagaStarted, policy: GPUClusterPolicySpec, now: datetime
) -> NodeSaga:
    """The saga `started` began, as `new_saga` made it; `ValueError` (a pydantic
    `ValidationError` among them) when the record cannot start one under `policy`."""
    return new_saga(
        node=node,
        rollout_id=started.rollout_id,
        policy=policy,
        running=started.running_versions,
        now=now,
        boot_id=started.boot_id,
        unschedulable=started.unschedulable,
        operands=started.operands,
        expected_devices=started.expected_devices,
        pool=started.pool,
        reason=started.reason,
        bring_up=started.bring_up,
        kernel_release=started.kernel_release,
        saga_id=started.saga_id,
        flavour=started.flavour,
        running_flavour=started.running_flavour,
    )


def start_of(saga: NodeSaga, running: Mapping[Component, str | None]) -> SagaStarted:
    """The `SagaStarted` that `started_saga` rebuilds `saga` from, `running` being the
    versions the node ran when it started."""
    return SagaStarted(
        rollout_id=saga.rollout_id,
        saga_id=saga.saga_id,
        running_versions=dict(running),
        boot_id=saga.boot_id,
        unschedulable=saga.initially_unschedulable,
        operands=saga.operands,
        expected_devices=saga.expected_devices,
        pool=saga.pool,
        reason=saga.reason,
        bring_up=saga.bring_up,
        kernel_release=saga.kernel_release,
        flavour=saga.targets[Component.GPU].flavour if Component.GPU in saga.targets else None,
        running_flavour=saga.previous_flavour,
    )


def step(
    saga: NodeSaga, event: Event, policy: GPUClusterPolicySpec, now: datetime
) -> Decision | None:
    """Decide `event` for `saga` at `now`: the decision, or None when the event means nothing
    to the saga or leaves it as it was (then nothing is stored, published or done)."""
    meaning = trigger(saga, event)
    if meaning is None:
        return None
    decision = decide(saga, meaning, policy, now)
    return None if decision.saga == saga else decision


@dataclass(frozen=True)
class StateChange:
    """A public state change a decision publishes, with the id that makes a republished one
    a duplicate (`transition_event_id`)."""

    id: str
    payload: NodeUpgradeStateChanged


Output = StateChange | IssuedCommand
"""What a decision publishes: its state changes, and its commands (with their ids too)."""


def outputs(decision: Decision) -> list[Output]:
    """The decision's state changes, then its commands: the order the outbox publishes them
    in (nothing that could lead to the node's next decision exists before its state change)."""
    saga = decision.saga
    first = saga.sequence - len(decision.transitions) + 1
    changes: list[Output] = [
        StateChange(transition_event_id(saga, first + offset), state_changed(saga, transition))
        for offset, transition in enumerate(decision.transitions)
    ]
    return changes + list(decision.commands)
