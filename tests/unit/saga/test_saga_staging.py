"""Nothing is drained for a package that cannot be installed: cordon-required stages every
component's package before it cordons, and a stage that fails (or runs past its deadline)
ends the attempt in upgrade-failed with the node never cordoned, its pods never touched and
no driver rolled back."""

from __future__ import annotations

from gpuop.events import driver as dm
from gpuop.events import kube
from gpuop.events.driver import Component
from gpuop.saga import actions, admission
from gpuop.saga.admission import NodeStatus
from gpuop.saga.machine import StepResult
from gpuop.saga.upgrade import kind as upgrade
from gpuop.saga.upgrade.steps import StepKind
from tests.support.sagas import T0, Run, S, policy, saga_for


def test_a_failed_stage_ends_the_attempt_before_the_cordon_with_nothing_to_undo() -> None:
    run = Run(policy(ofed=True, drain={"enable": True}, retry={"max_attempts": 2}))
    run.admit()
    run.ok()  # stage-gpu
    assert run.saga.step.token == "stage-ofed"
    decision = run.fail("no such version (it has: 24.10-1)")
    assert [(t.from_state, t.to_state) for t in decision.transitions] == [
        (S.CORDON_REQUIRED, S.UPGRADE_FAILED)
    ]
    assert run.work() == ["stage:gpu", "stage:ofed"]  # no cordon, no pod touched, no rollback
    saga = run.saga
    assert not saga.cordoned and not saga.operands_paused and saga.touched == ()
    assert saga.failure is not None and saga.failure.step == "stage-ofed"
    assert saga.failure.reason == "DriverStageFailed ofed: no such version (it has: 24.10-1)"
    assert saga.step.kind is StepKind.BACKOFF  # retried, staging again first
    run.expire()
    run.admit()
    assert run.saga.step.token == "stage-gpu" and run.saga.attempt == 2


def test_a_stage_past_its_deadline_fails_the_node_uncordoned() -> None:
    run = Run(policy(deadlines={"driver_stage": 120}))
    run.admit()
    (stage,) = run.decisions[-1].commands
    assert isinstance(stage.payload, dm.StageDriver)
    assert stage.payload.timeout_seconds == 108  # 90% of the deadline, for its own report
    run.expire()
    assert run.state is S.UPGRADE_FAILED and not run.saga.cordoned
    assert run.saga.history[-1].result is StepResult.EXPIRED
    assert run.saga.last_error == "stage-gpu did not finish within 120 s"
    assert "cordon" not in run.work()


def test_the_stage_command_carries_the_target_and_its_source() -> None:
    spec = policy()
    run = Run(spec)
    decision = run.admit()
    (stage,) = decision.commands
    assert stage.step == "stage-gpu" and stage.payload == dm.StageDriver(
        component=Component.GPU,
        version=run.saga.targets[Component.GPU].version,
        source=dm.DriverSource(uri="/srv/drivers"),
        timeout_seconds=810,
    )
    assert not [a for a in decision.kube_actions if isinstance(a, actions.Cordon)]
    # the stored saga's pending step is issued again, under the same id, after a crash
    assert upgrade.pending(run.saga, spec).commands == decision.commands


def test_the_node_seen_unschedulable_while_staging_is_not_taken_as_cordoned() -> None:
    run = Run(policy())
    run.admit()
    decision = run.feed(kube.NodeObserved(ready=True, unschedulable=True))
    assert decision.transitions == () and run.saga.step.kind is StepKind.STAGE
    stale = dm.DriverStaged(command_id="an-earlier-attempt", component=Component.GPU, version="1")
    run.feed(stale)
    assert run.saga.step.kind is StepKind.STAGE  # another command's answer is not ours
    run.ok()
    assert run.saga.step.kind is StepKind.CORDON and run.saga.cordoned


def test_a_component_without_a_source_is_not_staged() -> None:
    run = Run(policy(source=None))
    decision = run.admit()
    assert run.saga.step.kind is StepKind.CORDON
    assert run.work() == ["cordon"] and decision.commands == ()


def test_a_staging_node_holds_its_place_in_the_unavailable_budget() -> None:
    spec = policy(max_parallel_upgrades=0, max_unavailable=1)
    staging = saga_for(spec, node="a").model_copy(update={"state": S.CORDON_REQUIRED})
    waiting = saga_for(spec, node="b")
    nodes = {"a": NodeStatus(), "b": NodeStatus(), "c": NodeStatus()}
    planned = admission.plan([staging, waiting], nodes, spec, T0)
    assert planned.unavailable == 1 and planned.nodes == ()
