"""One fold from the log to decisions: what the runtime and `gpuop replay` both do with an
event, written once, so that a replay equals the runtime by construction.

    inbound    which events the orchestrator's intake consumes (`INBOUND_DOMAINS`,
               `INBOUND_TYPES`; the intake builds its subject filters from them)
    trigger    what an inbound event means to a node's saga (`NodeAdmitted` becomes
               `Admitted` for the saga and attempt it names, with the components it lets
               the saga upgrade, or nothing)
    started    a saga built from its `SagaStarted`, and the `SagaStarted` of a new saga
    step       one decision, or None when the saga is left as it was
    KIND       the upgrade as the runtime and replay run it (`gpuop.saga.kinds.SagaKind`;
               its `outputs`: a decision's state changes and commands, in publishing order,
               with their ids)

Pure: no bus, no clock, no I/O (the saga core's import contract holds here too).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from gpuop.events import Event, Payload, kube, subjects
from gpuop.events import device as dev
from gpuop.events import hardware as hw
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.driver import Component
from gpuop.events.upgrade import (
    TERMINAL_STATES,
    NodeAdmitted,
    NodeUpgradeStateChanged,
    SagaStarted,
    UpgradeState,
)
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import kinds, tallies
from gpuop.saga.actions import Decision
from gpuop.saga.upgrade.core import Admitted, Trigger, decide, state_changed
from gpuop.saga.upgrade.kind import NAME, pending
from gpuop.saga.upgrade.records import NodeSaga, new_saga

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
        running_parameters=started.running_parameters,
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
        running_parameters=saga.previous_parameters,
    )


def step(
    saga: NodeSaga, event: Event, policy: GPUClusterPolicySpec, now: datetime
) -> Decision | None:
    """Decide `event` for `saga` at `now`: the decision, or None when the event means nothing
    to the saga or leaves it as it was (then nothing is stored, published or done)."""
    return kinds.fold_step(decide, trigger, saga, event, policy, now)


def subjects_of(prefix: str) -> tuple[str, ...]:
    """The intake's subjects for the upgrade: its domains and its other inbound events."""
    return (
        *(subjects.events_filter(domain, prefix=prefix) for domain in INBOUND_DOMAINS),
        *(
            subjects.events_filter(inbound.DOMAIN, name=inbound.NAME, prefix=prefix)
            for inbound in INBOUND_TYPES
        ),
    )


def start(
    node: str, started: SagaStarted, policy: GPUClusterPolicySpec | None, now: datetime
) -> kinds.Start[NodeSaga]:
    """The saga `started` began (`started_saga`); `NoPolicy` without a policy."""
    if policy is None:
        raise kinds.NoPolicy("no policy recorded before it")
    return kinds.Start(started_saga(node, started, policy, now))


def holds(saga: NodeSaga) -> bool:
    """The upgrade holds its node: admitted and not ended (every other kind waits)."""
    return saga.state not in (UpgradeState.UPGRADE_REQUIRED, *TERMINAL_STATES)


KIND: kinds.SagaKind[NodeSaga] = kinds.SagaKind(
    name=NAME,
    key_prefix="",
    decode=NodeSaga.from_json,
    inbound=is_inbound,
    subjects=subjects_of,
    trigger=trigger,
    step=step,
    state_changed=state_changed,
    pending=pending,
    holds=holds,
    waiting=lambda saga: saga.state is UpgradeState.UPGRADE_REQUIRED,
    terminal=TERMINAL_STATES,
    state_change=NodeUpgradeStateChanged,
    started_by=SagaStarted,
    start=start,
    correlation=lambda saga: saga.rollout_id,
    settles=tallies.settles,
)
"""The driver upgrade as the runtime and replay run it."""
