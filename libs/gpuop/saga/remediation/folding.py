"""The GPU remediation's fold, shared by the orchestrator's runtime and `gpuop replay`.

    inbound    the events a remediation decides: a GPU's health, the holders' listing, the
               reset's answer, operand confirmations, driver validations, Kubernetes
               outcomes and observations, inventories (boot id), deadlines, admissions,
               and the node's upgrade moves (a folded remediation ends with them)
    step       one decision, or None when the saga is left as it was
    state_changed
               a move's public state change (the kind's `outputs` publish them first)
    holds      whether a saga holds its node (unavailable to every other kind); `waiting`
               whether it waits for an admission
    KIND       the remediation as the runtime and replay run it, with its circuit breaker
               (`breaker`, `remediation.maxPerHour`), put to by the starter and replay alike

Pure, like the kind.
"""

from __future__ import annotations

from datetime import datetime

from gpuop.events import Event, kube
from gpuop.events import device as dev
from gpuop.events import driver as dm
from gpuop.events import hardware as hw
from gpuop.events import remediation_commands as cmd
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.remediation import (
    TERMINAL_STATES,
    NodeRemediationStateChanged,
    RemediationRefused,
    RemediationStarted,
)
from gpuop.events.remediation import RemediationState as S
from gpuop.events.upgrade import NodeAdmitted, NodeUpgradeStateChanged
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import kinds, machine
from gpuop.saga.remediation import breaker, records
from gpuop.saga.remediation.kind import NAME, Decision, calls_for_remediation, decide, pending
from gpuop.saga.remediation.records import RemediationSaga

KEY_PREFIX = "remediation"
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

trigger = kinds.admission_trigger


def is_inbound(event: Event) -> bool:
    """Whether the remediation's fold consumes `event`."""
    if isinstance(event, NodeUpgradeStateChanged):
        return event.to_state.value in FOLDING_STATES
    return isinstance(event, _INBOUND) or event.DOMAIN == kube.DOMAIN


def step(
    saga: RemediationSaga, event: Event, spec: GPUClusterPolicySpec, now: datetime
) -> Decision | None:
    """Decide `event` for `saga` at `now`: the decision, or None when nothing changed."""
    if not is_inbound(event):
        return None
    return kinds.fold_step(decide, trigger, saga, event, spec, now)


def state_changed(
    saga: RemediationSaga, transition: machine.Transition[S]
) -> NodeRemediationStateChanged:
    return machine.state_event(
        NodeRemediationStateChanged, transition, saga_id=saga.saga_id, gpu_uuids=saga.gpu_uuids
    )


def holds(saga: RemediationSaga) -> bool:
    """The remediation holds its node (admitted, not ended, not folded)."""
    return saga.state not in (*TERMINAL_STATES, S.ADMISSION_REQUIRED, S.FOLDED)


def waiting(saga: RemediationSaga) -> bool:
    return saga.state is S.ADMISSION_REQUIRED


def start(
    node: str, started: RemediationStarted, policy: GPUClusterPolicySpec | None, now: datetime
) -> kinds.Start[RemediationSaga]:
    """The first record of the remediation `started` began (`records.start`)."""
    return kinds.Start(records.start(node, started, now))


def limit(policy: GPUClusterPolicySpec | None) -> int:
    """The breaker's limit: `remediation.maxPerHour` (0: none)."""
    return policy.remediation.max_per_hour if policy is not None else 0


def calls_for(event: Event, policy: GPUClusterPolicySpec | None) -> bool:
    """Whether `event` asks the breaker for a start: remediations enabled, and a health
    event that calls for one."""
    if policy is None or not policy.remediation.enabled:
        return False
    return calls_for_remediation(event)


BREAKER = kinds.Breaker(
    allows=breaker.allows,
    limit=limit,
    calls_for=calls_for,
    refused=RemediationRefused,
    noun="remediation",
    setting="remediation.maxPerHour",
    cause="health event",
)
"""The circuit breaker on remediation starts, for the starter and replay."""

KIND: kinds.SagaKind[RemediationSaga] = kinds.SagaKind(
    name=NAME,
    key_prefix=KEY_PREFIX,
    decode=RemediationSaga.from_json,
    inbound=is_inbound,
    subjects=kinds.named_subjects(
        ("device", "health-changed"),
        ("device", "gpu-holders-listed"),
        ("device", "gpu-holders-unknown"),
        *(("upgrade", state) for state in FOLDING_STATES),
    ),
    step=step,
    state_changed=state_changed,
    pending=pending,
    holds=holds,
    waiting=waiting,
    terminal=TERMINAL_STATES,
    state_change=NodeRemediationStateChanged,
    started_by=RemediationStarted,
    start=start,
    breaker=BREAKER,
)
"""The remediation as the runtime and replay run it."""
