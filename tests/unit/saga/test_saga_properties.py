"""Properties of the core under random event sequences and random policies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuop.events import device as dev
from gpuop.events import driver as dm
from gpuop.events import ids, kube
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.driver import Component
from gpuop.saga import actions
from gpuop.saga.upgrade import core, records, table
from gpuop.saga.upgrade import kind as upgrade
from gpuop.saga.upgrade.steps import StepKind
from tests.support.sagas import (
    BOOT_A,
    BOOT_B,
    GPU_NEW,
    GPU_OLD,
    OFED_NEW,
    OFED_OLD,
    T0,
    Run,
    S,
    inventory,
    policy,
)

BOOT_C = "cccccccc-cccc-4ccc-8ccc-cccccccccccc"
IDLE = frozenset({StepKind.ADMISSION, StepKind.DONE, StepKind.FAILED})
MOVES = (
    "ok",
    "fail",
    "fail",
    "expire",
    "admit",
    "stale-deadline",
    "stale-result",
    "node-observed",
    "inventory",
    "operand-paused",
    "removed",
)
STRIDE = 14
"""Each random move comes after up to this many successful steps, so walks reach every depth
of the flow (a reboot, a rollback, a retry) before something goes wrong."""

# Hundreds of examples, each a fleet or an event sequence: seconds alone, more on a busy
# machine, so more than the unit suite's per-test limit.
PROPERTY_TIMEOUT = 120


def apply(run: Run, move: str, boot: str, flag: bool) -> None:
    """Feed the event `move` names, when it makes sense in the saga's step."""
    kind = run.saga.step.kind
    if move == "ok" and kind is StepKind.ADMISSION:
        run.admit(canary=flag)
    elif move == "ok" and kind is StepKind.REBOOT:  # back on the old drivers, or the new
        gpu, ofed = (GPU_NEW, OFED_NEW) if flag else (GPU_OLD, OFED_OLD)
        run.feed(inventory(BOOT_C, gpu=gpu, ofed=ofed))
    elif move == "ok" and kind not in IDLE:
        run.ok()
    elif move == "fail" and kind not in IDLE:
        run.fail()
    elif move == "expire" and run.saga.deadline is not None:
        run.expire()
    elif move == "admit":
        run.admit(canary=flag)
    elif move == "stale-deadline":
        run.feed(
            DeadlineExpired(
                saga_id=run.saga.saga_id,
                state=run.saga.state,
                step="drain" if kind is not StepKind.DRAIN else "cordon",
                attempt=run.saga.attempt,
                deadline=T0,
            )
        )
    elif move == "stale-result":
        run.feed(dm.DriverUnloaded(command_id="0" * 32, component=Component.GPU))
    elif move == "node-observed":
        run.feed(kube.NodeObserved(ready=True, unschedulable=flag, boot_id=boot))
    elif move == "inventory":
        new = flag and boot != BOOT_A  # sometimes the node reports the target drivers
        gpu, ofed = (GPU_NEW, OFED_NEW) if new else (GPU_OLD, OFED_OLD)
        run.feed(inventory(boot, gpu=gpu, ofed=ofed))
    elif move == "operand-paused":
        run.feed(dev.OperandPaused(command_id=run.step_id, service=dev.OperandService.TELEMETRY))
    elif move == "removed" and flag and boot == BOOT_C:
        run.feed(kube.NodeRemoved())


policies = st.builds(
    lambda rollback, reboot, drain, selector, ofed, attempts: policy(
        ofed=ofed,
        rollback_on_failure=rollback,
        reboot_on_unload_failure=reboot,
        drain={"enable": drain},
        wait_for_completion={"pod_selector": "job=x" if selector else ""},
        retry={"max_attempts": attempts, "backoff_seconds": 5},
    ),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.integers(min_value=1, max_value=3),
)
moves = st.lists(
    st.tuples(
        st.sampled_from(range(STRIDE + 1)),
        st.sampled_from(MOVES),
        st.sampled_from((BOOT_A, BOOT_B, BOOT_C)),
        st.booleans(),
    ),
    max_size=12,
)


def walk(run: Run, sequence: list[tuple[int, str, str, bool]]) -> None:
    for successes, move, boot, flag in sequence:
        for _ in range(successes):
            apply(run, "ok", boot, flag)
        apply(run, move, boot, flag)


@pytest.mark.timeout(PROPERTY_TIMEOUT)
@settings(max_examples=500, deadline=None, derandomize=True)
@given(spec=policies, cordoned=st.booleans(), ofed_known=st.booleans(), sequence=moves)
def test_random_events_never_leave_the_table_or_reuse_ids(spec, cordoned, ofed_known, sequence):
    saga = records.new_saga(
        node="gpu-node-1",
        rollout_id="rollout-1",
        policy=spec,
        running={Component.GPU: GPU_OLD, Component.OFED: OFED_OLD if ofed_known else None},
        now=T0,
        boot_id=BOOT_A,
        unschedulable=cordoned,
    )
    run = Run(spec, saga)
    walk(run, sequence)

    for move in run.transitions():
        assert table.allowed(*move), move

    id_of: dict[tuple[str, int], str] = {}
    key_of: dict[str, tuple[str, int, str]] = {}
    reissued = [c for d in run.decisions for c in upgrade.pending(d.saga, spec).commands]
    for command in [*run.commands(), *reissued]:
        assert command.id == ids.step(run.saga.saga_id, command.step, command.attempt)
        key = (command.step, command.attempt)
        assert id_of.setdefault(key, command.id) == command.id, key
        what = (command.step, command.attempt, command.payload.TYPE)
        assert key_of.setdefault(command.id, what) == what, command.id
    for action in run.kube_actions():
        what = (type(action).__name__, 0, "")
        assert key_of.setdefault(action.id, what) == what, action

    for decision in run.decisions:
        saga = decision.saga
        if any(isinstance(a, actions.Uncordon) for a in decision.kube_actions):
            assert saga.touched == (), "uncordoned with a driver not validated"
            assert not saga.initially_unschedulable
        if saga.state not in (S.UPGRADE_REQUIRED, S.UPGRADE_DONE, S.UPGRADE_FAILED):
            assert saga.deadline is not None, f"{saga.state} waits without a deadline"
    assert records.NodeSaga.from_json(run.saga.to_json()) == run.saga


@pytest.mark.timeout(PROPERTY_TIMEOUT)
@settings(max_examples=50, deadline=None, derandomize=True)
@given(spec=policies, sequence=moves)
def test_replaying_the_same_events_reproduces_every_decision(spec, sequence):
    first = Run(spec)
    walk(first, sequence)
    replay = Run(spec)
    for event, at, original in zip(first.events, first.times, first.decisions, strict=True):
        decision = core.decide(replay.saga, event, spec, at)
        assert decision == original
        replay.saga = decision.saga
