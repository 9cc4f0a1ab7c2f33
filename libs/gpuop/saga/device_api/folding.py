"""The device-API switch's fold, shared by the orchestrator's runtime and `gpuop replay`.

    inbound    the events a switch decides: the device plugin's `DeviceApiApplied`,
               Kubernetes outcomes and observations, expired deadlines, admissions
    started    a saga built from its `DeviceApiSwitchStarted`, and that event for a saga
    step       one decision, or None when the saga is left as it was
    state_changed
               a move's public state change (the kind's `outputs` publish them first)
    holds      whether a saga holds its node (unavailable to every other kind); `waiting`
               whether it waits for an admission
    KIND       the switch as the runtime and replay run it

Pure, like the kind.
"""

from __future__ import annotations

from datetime import datetime

from gpuop.events import Event, kube
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.device_api import DeviceApiSwitchStarted, NodeDeviceApiStateChanged
from gpuop.events.device_api_commands import DeviceApiApplied
from gpuop.events.upgrade import NodeAdmitted
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import kinds, machine
from gpuop.saga.device_api import kind, records
from gpuop.saga.device_api.records import DeviceApiSaga
from gpuop.saga.device_api.states import TERMINAL_STATES, DeviceApiState

KEY_PREFIX = "device-api"
INBOUND: tuple[type[Event], ...] = (DeviceApiApplied, DeadlineExpired, NodeAdmitted)


def is_inbound(event: Event) -> bool:
    """Whether the switch's fold consumes `event`."""
    return isinstance(event, INBOUND) or event.DOMAIN == kube.DOMAIN


trigger = kinds.admission_trigger


def started(node: str, event: DeviceApiSwitchStarted, now: datetime) -> DeviceApiSaga:
    """The saga `event` started (before its first decision, `kind.begin`)."""
    saga = records.new_saga(
        node=node, cause="-", api=event.api, previous=event.previous, now=now, reason=event.reason
    )
    return saga.model_copy(update={"saga_id": event.saga_id})


def start_of(saga: DeviceApiSaga) -> DeviceApiSwitchStarted:
    """The `DeviceApiSwitchStarted` that `started` rebuilds `saga` from."""
    return DeviceApiSwitchStarted(
        saga_id=saga.saga_id, api=saga.api, previous=saga.previous, reason=saga.reason
    )


def step(
    saga: DeviceApiSaga, event: Event, spec: GPUClusterPolicySpec, now: datetime
) -> kind.Decision | None:
    """Decide `event` for `saga` at `now`: the decision, or None when nothing changed."""
    if not is_inbound(event):
        return None
    return kinds.fold_step(kind.decide, trigger, saga, event, spec, now)


def state_changed(
    saga: DeviceApiSaga, transition: machine.Transition[DeviceApiState]
) -> NodeDeviceApiStateChanged:
    return machine.state_event(
        NodeDeviceApiStateChanged, transition, saga_id=saga.saga_id, api=saga.api
    )


def holds(saga: DeviceApiSaga) -> bool:
    """The switch holds its node: admitted and not ended."""
    return saga.state not in (*TERMINAL_STATES, DeviceApiState.SWITCH_REQUIRED)


def waiting(saga: DeviceApiSaga) -> bool:
    """The switch waits for its admission."""
    return saga.state is DeviceApiState.SWITCH_REQUIRED


def start(
    node: str,
    event: DeviceApiSwitchStarted,
    policy: GPUClusterPolicySpec | None,
    now: datetime,
) -> kinds.Start[DeviceApiSaga] | None:
    """The saga `event` started, after its first decision (`kind.begin`); None without a
    policy to decide it under."""
    if policy is None:
        return None
    first = kind.begin(started(node, event, now), policy, now)
    return kinds.Start(first.saga, first)


KIND: kinds.SagaKind[DeviceApiSaga] = kinds.SagaKind(
    name=kind.NAME,
    key_prefix=KEY_PREFIX,
    decode=DeviceApiSaga.from_json,
    inbound=is_inbound,
    subjects=kinds.named_subjects((DeviceApiApplied.DOMAIN, DeviceApiApplied.NAME)),
    step=step,
    state_changed=state_changed,
    pending=kind.pending,
    holds=holds,
    waiting=waiting,
    terminal=TERMINAL_STATES,
    state_change=NodeDeviceApiStateChanged,
    started_by=DeviceApiSwitchStarted,
    start=start,
)
"""The device-API switch as the runtime and replay run it."""
