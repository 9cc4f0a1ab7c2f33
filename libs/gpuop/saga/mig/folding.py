"""The MIG reconfiguration's fold, shared by the orchestrator's runtime and `gpuop replay`.

    inbound    the events a reconfiguration decides: a relabel (queued), operand
               confirmations, the holders' listing, the apply's answers, Kubernetes outcomes
               and observations, expired deadlines, admissions
    started    a saga built from its `MigReconfigurationStarted`, and that event for a saga
    step       one decision, or None when the saga is left as it was
    state_changed
               a move's public state change (the kind's `outputs` publish them first)
    holds      whether a saga holds its node (unavailable to every other kind); `waiting`
               whether it waits for an admission
    KIND       the reconfiguration as the runtime and replay run it

Pure, like the kind.
"""

from __future__ import annotations

from datetime import datetime

from gpuop.events import Event, kube
from gpuop.events import device as dev
from gpuop.events import hardware as hw
from gpuop.events import mig_commands as migev
from gpuop.events import remediation_commands as rem
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.mig import MigReconfigurationStarted, NodeMigStateChanged
from gpuop.events.mig_requests import MigConfigRequested
from gpuop.events.upgrade import NodeAdmitted
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import kinds, machine
from gpuop.saga.mig import kind, records
from gpuop.saga.mig.records import MigSaga
from gpuop.saga.mig.states import TERMINAL_STATES, MigState, config_state

KEY_PREFIX = "mig"
INBOUND: tuple[type[Event], ...] = (
    MigConfigRequested,
    dev.OperandPaused,
    dev.OperandResumed,
    rem.GpuHoldersListed,
    rem.GpuHoldersUnknown,
    migev.MigLayoutApplied,
    migev.MigLayoutFailed,
    DeadlineExpired,
    NodeAdmitted,
    hw.HardwareDiscovered,
)


def is_inbound(event: Event) -> bool:
    """Whether the reconfiguration's fold consumes `event`."""
    return isinstance(event, INBOUND) or event.DOMAIN == kube.DOMAIN


trigger = kinds.admission_trigger


def started(node: str, event: MigReconfigurationStarted, now: datetime) -> MigSaga:
    """The saga `event` started (before its first decision, `kind.begin`)."""
    saga = records.new_saga(
        node=node, request_id=event.request_id, plan=event.plan, now=now,
        operands=event.operands, boot_id=event.boot_id,
    )  # fmt: skip
    return saga.model_copy(update={"saga_id": event.saga_id})


def start_of(saga: MigSaga) -> MigReconfigurationStarted:
    """The `MigReconfigurationStarted` that `started` rebuilds `saga` from."""
    return MigReconfigurationStarted(
        saga_id=saga.saga_id, request_id=saga.request_id, plan=saga.plan,
        operands=saga.operands, boot_id=saga.boot_id,
    )  # fmt: skip


def step(
    saga: MigSaga, event: Event, spec: GPUClusterPolicySpec, now: datetime
) -> kind.Decision | None:
    """Decide `event` for `saga` at `now`: the decision, or None when nothing changed."""
    if not is_inbound(event):
        return None
    return kinds.fold_step(kind.decide, trigger, saga, event, spec, now)


def state_changed(saga: MigSaga, transition: machine.Transition[MigState]) -> NodeMigStateChanged:
    return machine.state_event(
        NodeMigStateChanged,
        transition,
        saga_id=saga.saga_id,
        config=saga.config,
        config_state=config_state(transition.to_state),
    )


def holds(saga: MigSaga) -> bool:
    """The reconfiguration holds its node: admitted and not ended."""
    return saga.state not in (*TERMINAL_STATES, MigState.MIG_CONFIG_REQUIRED)


def waiting(saga: MigSaga) -> bool:
    """The reconfiguration waits for its admission."""
    return saga.state is MigState.MIG_CONFIG_REQUIRED


def start(
    node: str,
    event: MigReconfigurationStarted,
    policy: GPUClusterPolicySpec | None,
    now: datetime,
) -> kinds.Start[MigSaga] | None:
    """The saga `event` started, after the first decision the runtime carried out as it
    recorded the start (`kind.begin`); None without a policy to decide it under."""
    if policy is None:
        return None
    first = kind.begin(started(node, event, now), policy, now)
    return kinds.Start(first.saga, first)


KIND: kinds.SagaKind[MigSaga] = kinds.SagaKind(
    name=kind.NAME,
    key_prefix=KEY_PREFIX,
    decode=MigSaga.from_json,
    inbound=is_inbound,
    subjects=kinds.named_subjects(
        ("device", "mig-config-requested"),
        ("device", "gpu-holders-listed"),
        ("device", "gpu-holders-unknown"),
    ),
    step=step,
    state_changed=state_changed,
    pending=kind.pending,
    holds=holds,
    waiting=waiting,
    terminal=TERMINAL_STATES,
    state_change=NodeMigStateChanged,
    started_by=MigReconfigurationStarted,
    start=start,
)
"""The MIG reconfiguration as the runtime and replay run it."""
