"""The saga record: built from the policy and inventory, stored as JSON, bounded."""

from __future__ import annotations

import gc
import tracemalloc
from datetime import timedelta

import pytest

from gpuop.events.driver import Component
from gpuop.saga.machine import StepResult
from gpuop.saga.upgrade import records
from gpuop.saga.upgrade.steps import Step, StepKind
from tests.support.sagas import GPU_NEW, GPU_OLD, OFED_NEW, OFED_OLD, T0, Run, S, policy


def test_new_saga_targets_only_the_components_that_change():
    spec = policy(ofed=True)
    saga = records.new_saga(
        node="gpu-node-7",
        rollout_id="rollout-9",
        policy=spec,
        running={Component.GPU: GPU_OLD, Component.OFED: OFED_OLD},
        now=T0,
        unschedulable=True,
    )
    assert saga.saga_id == "rollout-9/gpu-node-7"
    assert saga.state is S.UPGRADE_REQUIRED and saga.attempt == 1
    assert saga.components == (Component.GPU, Component.OFED)
    assert saga.targets[Component.OFED].version == OFED_NEW
    assert saga.previous_versions == {Component.GPU: GPU_OLD, Component.OFED: OFED_OLD}
    assert saga.initially_unschedulable and saga.deadline is None


def test_an_unknown_running_version_is_upgraded_without_a_rollback_target():
    saga = records.new_saga(
        node="n", rollout_id="r", policy=policy(), running={Component.GPU: None}, now=T0
    )
    assert saga.components == (Component.GPU,) and saga.previous_versions == {}


def test_a_node_already_on_the_targets_gets_no_saga():
    with pytest.raises(ValueError, match="nothing to upgrade"):
        records.new_saga(
            node="n", rollout_id="r", policy=policy(), running={Component.GPU: GPU_NEW}, now=T0
        )


def test_saga_round_trips_through_json_at_every_step():
    run = Run(policy(ofed=True, reboot_on_unload_failure=True))
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    run.ok()
    run.ok()
    run.fail("in use")
    run.until(S.UPGRADE_DONE)
    for decision in run.decisions:
        stored = decision.saga.to_json()
        assert records.NodeSaga.from_json(stored) == decision.saga


def test_history_keeps_only_the_latest_outcomes():
    saga = Run(policy()).saga
    for index in range(records.HISTORY_LIMIT + 5):
        saga = saga.with_outcome(
            records.Outcome(
                at=T0,
                attempt=1,
                state=S.CORDON_REQUIRED,
                step="cordon",
                result=StepResult.SUCCEEDED,
                detail=str(index),
            )
        )
    assert len(saga.history) == records.HISTORY_LIMIT
    assert saga.history[-1].detail == str(records.HISTORY_LIMIT + 4)


def test_a_decoded_saga_with_a_full_history_stays_small():
    """The orchestrator keeps every node's saga decoded (`SagaStore`): 5,000 of them must
    fit its memory budget (tests/bench/scale.py) even with full histories."""
    saga = Run(policy()).saga
    for index in range(records.HISTORY_LIMIT):
        outcome = records.Outcome(
            at=T0 + timedelta(seconds=index),
            attempt=1,
            state=S.DRAIN_REQUIRED,
            step="drain",
            result=StepResult.SUCCEEDED,
            detail=f"{index} pods evicted",
        )
        saga = saga.with_outcome(outcome)
    stored = saga.to_json()
    gc.collect()
    tracemalloc.start()
    try:
        decoded = [records.NodeSaga.from_json(stored) for _ in range(100)]
        per_saga = tracemalloc.get_traced_memory()[0] / len(decoded)
    finally:
        tracemalloc.stop()
    assert decoded[0] == saga
    assert per_saga < 24 * 1024  # a model instance per outcome made it 75 KB


def test_step_tokens_name_kind_component_and_round():
    assert Step(kind=StepKind.CORDON).token == "cordon"
    assert Step(kind=StepKind.UNLOAD, component=Component.OFED).token == "unload-ofed"
    assert Step(kind=StepKind.LOAD, component=Component.GPU, round=2).token == "load-gpu-2"
