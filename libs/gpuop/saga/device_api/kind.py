"""The device-API switch as a saga kind: its table, phases and hooks, handed to the machinery.

table      `states.TABLE`; phases `phases.PHASES`, one module per state
removed    the node is gone: failed, whatever was under way
announce   `drafting.announce`: the node's Events
limit      `steps.limit_seconds`

`begin` is the saga's first decision, made when the runtime creates it: the switch waits
for its admission. `decide` is every later one; `pending` is what a runtime that takes the
saga over issues again. Pure.
"""

from __future__ import annotations

from datetime import datetime

from gpuop.events import Event
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import machine
from gpuop.saga.device_api.drafting import Draft, announce
from gpuop.saga.device_api.phases import PHASES
from gpuop.saga.device_api.records import DeviceApiSaga, StepResult, SwitchStep
from gpuop.saga.device_api.states import TABLE, TERMINAL_STATES, DeviceApiState
from gpuop.saga.device_api.steps import limit_seconds
from gpuop.saga.machine import Kind, Trigger

S = DeviceApiState
NAME = "device-api"
NODE_REMOVED = "the node was removed"

Decision = machine.Decision[DeviceApiSaga, DeviceApiState]


def observe(draft: Draft, event: Event) -> None:
    """Nothing to keep aside: a policy change while a switch runs starts the next one
    after it ends."""


def removed(draft: Draft) -> None:
    """The node object is gone: the switch fails, whatever it was doing."""
    if draft.saga.state in TERMINAL_STATES:
        return
    draft.outcome(StepResult.SKIPPED, NODE_REMOVED)
    draft.move(S.FAILED, NODE_REMOVED, retry=False)


def _limit(saga: DeviceApiSaga, step: SwitchStep, spec: GPUClusterPolicySpec) -> float | None:
    return limit_seconds(step, spec.upgrade_policy)


DEVICE_API: Kind[DeviceApiSaga, DeviceApiState, Draft] = Kind(
    name=NAME,
    table=TABLE,
    phases=PHASES,
    retry_state=S.SWITCH_REQUIRED,
    observe=observe,
    removed=removed,
    announce=announce,
    limit=_limit,
    step_type=SwitchStep,
)
"""The device-API switch, a saga kind beside the others."""
DEVICE_API.check()


def begin(saga: DeviceApiSaga, policy: GPUClusterPolicySpec, now: datetime) -> Decision:
    """The first decision of a saga `records.new_saga` made: it waits for its admission."""
    return Draft(DEVICE_API, saga, policy, now).decision()


def decide(
    saga: DeviceApiSaga, trigger: Trigger, policy: GPUClusterPolicySpec, now: datetime
) -> Decision:
    """The saga after `trigger` at `now`, with the commands, actions and moves it causes."""
    return machine.decide(Draft(DEVICE_API, saga, policy, now), trigger).decision()


def pending(saga: DeviceApiSaga, policy: GPUClusterPolicySpec) -> Decision:
    """What to issue again for a saga read back after a crash: the pending step's commands
    and actions, with the ids they had when first issued."""
    return DEVICE_API.pending(saga, policy)
