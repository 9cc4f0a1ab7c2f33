"""MIG reconfiguration as a saga kind: its table, phases and hooks, handed to the machinery.

table      `states.TABLE`; phases `phases.PHASES`, one module per state
observe    a later request for the node (`MigConfigRequested` naming another config) is
           queued in the record (`MigSaga.queued`, the latest wins; naming the running
           config again, or removing the label, clears it): the runtime starts it once this
           saga ends (`next_request`), never interleaved with it
removed    the node is gone: failed, whatever was under way
announce   `drafting.announce`: `nvidia.com/mig.config.state` and the node's Events
limit      `steps.limit_seconds`

`begin` is the saga's first decision, made when the runtime creates it: a request that
cannot run fails at once, one that changes no GPU is done at once, the others show
`pending` and wait for admission. `decide` is every later one; `pending` is what a runtime
that takes the saga over issues again. Pure.
"""

from __future__ import annotations

from datetime import datetime

from gpuop.events import Event, ids, kube
from gpuop.events import hardware as hw
from gpuop.events.mig_requests import MigConfigRequested
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import machine
from gpuop.saga.machine import Kind, StepResult, Trigger
from gpuop.saga.mig.drafting import Draft, announce, label_action
from gpuop.saga.mig.phases import PHASES
from gpuop.saga.mig.records import MigSaga, MigStep, MigStepKind
from gpuop.saga.mig.states import TABLE, TERMINAL_STATES, MigState
from gpuop.saga.mig.steps import limit_seconds

S = MigState
NAME = "mig-reconfiguration"
NODE_REMOVED = "the node was removed"

Decision = machine.Decision[MigSaga, MigState]


def observe(draft: Draft, event: Event) -> None:
    """Keep the node's boot id (not while a reboot is awaited: the new one confirms it), and
    queue a later request while this one runs."""
    saga = draft.saga
    if (
        isinstance(event, kube.NodeObserved | hw.HardwareDiscovered)
        and event.boot_id
        and saga.state not in (*TERMINAL_STATES, S.REBOOT_REQUIRED)
        and event.boot_id != saga.boot_id
    ):
        draft.update(boot_id=event.boot_id)
    if not isinstance(event, MigConfigRequested) or saga.state in TERMINAL_STATES:
        return
    queued = None if event.config in (None, saga.config) else event.config
    if queued != saga.queued:
        draft.update(queued=queued)


def removed(draft: Draft) -> None:
    """The node object is gone: the request fails, whatever it was doing."""
    saga = draft.saga
    if saga.state in TERMINAL_STATES:
        return
    draft.outcome(StepResult.SKIPPED, NODE_REMOVED)
    draft.move(S.MIG_CONFIG_FAILED, NODE_REMOVED, retry=False)


def _limit(saga: MigSaga, step: MigStep, spec: GPUClusterPolicySpec) -> float | None:
    return limit_seconds(step, spec.mig)


MIG: Kind[MigSaga, MigState, Draft] = Kind(
    name=NAME,
    table=TABLE,
    phases=PHASES,
    retry_state=S.MIG_CONFIG_REQUIRED,
    observe=observe,
    removed=removed,
    announce=announce,
    limit=_limit,
    step_type=MigStep,
)
"""MIG reconfiguration, a saga kind beside the driver upgrade."""
MIG.check()


def begin(saga: MigSaga, policy: GPUClusterPolicySpec, now: datetime) -> Decision:
    """The first decision of a saga `records.new_saga` made: fail a request whose plan has
    a problem, end one that changes no GPU, else show `pending` and wait for admission."""
    draft = Draft(MIG, saga, policy, now)
    plan = saga.plan
    if plan.problem:
        draft.fail(plan.problem)
    elif not plan.recarved:
        step = MigStep(kind=MigStepKind.ADMISSION)
        reason = "the GPUs have the requested layout already"
        draft.skip(step, S.MIG_CONFIG_DONE, StepResult.SKIPPED, reason)
    else:
        draft.actions.append(label_action(saga))
    return draft.decision()


def decide(
    saga: MigSaga, trigger: Trigger, policy: GPUClusterPolicySpec, now: datetime
) -> Decision:
    """The saga after `trigger` at `now`, with the commands, actions and moves it causes."""
    return machine.decide(Draft(MIG, saga, policy, now), trigger).decision()


def pending(saga: MigSaga, policy: GPUClusterPolicySpec) -> Decision:
    """What to issue again for a saga read back after a crash: its state label, the
    pending step's commands and actions, with the ids they had when first issued."""
    return MIG.pending(saga, policy, label_action(saga))


def next_request(saga: MigSaga) -> tuple[str, str] | None:
    """The config queued behind an ended saga and the request id its saga starts under
    (derived from this saga's, so a replay starts it alike); None while it runs, or when
    nothing is queued."""
    if saga.state not in TERMINAL_STATES or saga.queued is None:
        return None
    return saga.queued, ids.step(saga.saga_id, "queued", saga.sequence)
