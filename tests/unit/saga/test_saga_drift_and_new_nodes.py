"""Kernel drift and new nodes in the decision core and admission: why a saga starts
(`start_reason`), a new node brought up without a slot while a rollout holds every one, its
path behind the driver-not-ready taint (no cordon, no pod removal), the taint removed only
once its driver validated, and kept, with the reason, when it did not."""

from __future__ import annotations

from gpuop.events import kube
from gpuop.events.driver import Component
from gpuop.events.upgrade import DRIVER_NOT_READY_TAINT, SagaReason
from gpuop.saga import actions, admission
from gpuop.saga.admission import NodeStatus
from gpuop.saga.machine import StepResult
from gpuop.saga.upgrade import folding, records
from gpuop.saga.upgrade.kind import pending
from gpuop.saga.upgrade.steps import StepKind
from tests.support.sagas import BOOT_A, GPU_NEW, GPU_OLD, OFED_OLD, T0, Run, S, policy, saga_for

KERNEL_OLD, KERNEL_NEW = "6.1.0-41-amd64", "6.1.0-44-amd64"
NO_DRIVER = {Component.GPU: None, Component.OFED: OFED_OLD}


def done_on(kernel: str) -> records.NodeSaga:
    return saga_for(policy()).model_copy(update={"state": S.UPGRADE_DONE, "kernel_release": kernel})


def test_a_node_without_a_driver_after_a_kernel_change_is_a_kernel_drift() -> None:
    reason = records.start_reason(policy(), NO_DRIVER, KERNEL_NEW, done_on(KERNEL_OLD))
    assert reason is SagaReason.KERNEL_DRIFT


def test_a_node_without_a_driver_on_the_same_kernel_or_never_upgraded_has_no_driver() -> None:
    spec = policy()
    assert records.start_reason(spec, NO_DRIVER, KERNEL_OLD, done_on(KERNEL_OLD)) is (
        SagaReason.NO_DRIVER
    )
    assert records.start_reason(spec, NO_DRIVER, KERNEL_NEW, None) is SagaReason.NO_DRIVER
    failed = done_on(KERNEL_OLD).model_copy(update={"state": S.UPGRADE_FAILED})
    assert records.start_reason(spec, NO_DRIVER, KERNEL_NEW, failed) is SagaReason.NO_DRIVER


def test_a_driver_that_came_up_on_the_new_kernel_needs_nothing() -> None:
    running = {Component.GPU: GPU_NEW, Component.OFED: OFED_OLD}
    assert records.start_reason(policy(), running, KERNEL_NEW, done_on(KERNEL_OLD)) is None


def test_another_version_is_a_version_change() -> None:
    running = {Component.GPU: GPU_OLD, Component.OFED: OFED_OLD}
    reason = records.start_reason(policy(), running, KERNEL_NEW, done_on(KERNEL_OLD))
    assert reason is SagaReason.VERSION_CHANGE


def test_a_reinstall_has_an_id_of_its_own_and_replay_builds_it_alike() -> None:
    spec = policy()
    saga_id = records.reinstall_saga_id("rollout-1", "gpu-node-1", SagaReason.KERNEL_DRIFT, T0)
    assert saga_id != records.saga_id_for("rollout-1", "gpu-node-1")
    saga = records.new_saga(
        node="gpu-node-1", rollout_id="rollout-1", policy=spec, running=NO_DRIVER, now=T0,
        reason=SagaReason.KERNEL_DRIFT, bring_up=True, kernel_release=KERNEL_NEW,
        saga_id=saga_id, boot_id=BOOT_A,
    )  # fmt: skip
    started = folding.start_of(saga, NO_DRIVER)
    assert (started.reason, started.bring_up, started.kernel_release) == (
        SagaReason.KERNEL_DRIFT,
        True,
        KERNEL_NEW,
    )
    assert folding.started_saga("gpu-node-1", started, spec, T0) == saga


def new_node(node: str = "gpu-new") -> records.NodeSaga:
    return records.new_saga(
        node=node, rollout_id="rollout-1", policy=policy(), running=NO_DRIVER, now=T0,
        reason=SagaReason.NO_DRIVER, bring_up=True, kernel_release=KERNEL_NEW, boot_id=BOOT_A,
    )  # fmt: skip


def full_rollout() -> tuple[list[records.NodeSaga], dict[str, NodeStatus]]:
    """A rollout holding its one slot and its one unavailable node, two nodes waiting."""
    spec = policy()
    under_way = saga_for(spec, node="gpu-1").model_copy(
        update={"state": S.DRAIN_REQUIRED, "cordoned": True}
    )
    waiting = [saga_for(spec, node=name) for name in ("gpu-2", "gpu-3")]
    sagas = [under_way, *waiting, new_node()]
    return sagas, {s.node: NodeStatus() for s in sagas}


def test_a_new_node_is_admitted_while_the_rollout_holds_every_slot() -> None:
    spec = policy(max_parallel_upgrades=1, max_unavailable=1)
    sagas, nodes = full_rollout()
    planned = admission.plan(sagas, nodes, spec, T0)
    assert planned.nodes == ("gpu-new",)
    assert planned.in_progress == 1 and planned.unavailable == 1 and planned.slots == 0


def test_a_new_node_under_way_takes_no_slot_from_the_rollout() -> None:
    spec = policy(max_parallel_upgrades=1, max_unavailable=1)
    sagas, nodes = full_rollout()
    under_way = sagas[0].model_copy(update={"state": S.UPGRADE_DONE, "cordoned": False})
    bringing_up = sagas[3].model_copy(update={"state": S.DRIVER_RELOAD_REQUIRED})
    planned = admission.plan([under_way, *sagas[1:3], bringing_up], nodes, spec, T0)
    assert planned.nodes == ("gpu-2",)
    assert planned.in_progress == 0 and planned.unavailable == 0


def test_a_new_node_waits_while_paused_or_not_ready() -> None:
    sagas, nodes = full_rollout()
    assert "gpu-new" not in admission.plan(sagas, nodes, policy(paused=True), T0).nodes
    nodes["gpu-new"] = NodeStatus(ready=False)
    assert "gpu-new" not in admission.plan(sagas, nodes, policy(), T0).nodes


def test_a_new_node_is_not_held_back_by_the_canary() -> None:
    spec = policy(max_parallel_upgrades=1, canary={"nodes": 1})
    sagas, nodes = full_rollout()
    sagas[0] = sagas[0].model_copy(update={"canary": True})
    planned = admission.plan(sagas, nodes, spec, T0)
    assert planned.held_by_canary
    assert planned.nodes == ("gpu-new",)


def test_a_new_node_is_tainted_as_its_saga_starts_and_never_cordoned_nor_drained() -> None:
    spec = policy(drain={"enable": True}, wait_for_completion={"pod_selector": "app=job"})
    run = Run(spec, new_node())
    started = pending(run.saga, spec)
    assert [type(a) for a in started.kube_actions] == [actions.SetStateLabel, actions.Taint]
    run.admit()
    while run.state not in (S.OPERANDS_PAUSE_REQUIRED, S.DRIVER_RELOAD_REQUIRED):
        assert run.saga.step.kind is StepKind.STAGE, run.saga.step
        run.ok()
    issued = [a for d in run.decisions for a in d.kube_actions]
    assert not any(
        isinstance(a, actions.Cordon | actions.Drain | actions.DeletePods) for a in issued
    )
    assert not run.saga.cordoned
    for state in (S.CORDON_REQUIRED, S.WAIT_FOR_JOBS_REQUIRED, S.DRAIN_REQUIRED):
        assert state in run.states()
    skipped = [o for o in run.saga.history if o.state is S.POD_DELETION_REQUIRED]
    assert skipped[-1].result is StepResult.SKIPPED
    assert "driver-not-ready" in skipped[-1].detail


def test_the_taint_goes_only_once_the_driver_validated() -> None:
    run = Run(policy(), new_node())
    run.admit()
    run.until(S.UNCORDON_REQUIRED)
    untaint = [a for a in run.decisions[-1].kube_actions if isinstance(a, actions.Untaint)]
    assert [a.id for a in untaint] == [run.step_id]
    assert run.feed(kube.NodeObserved(ready=True, unschedulable=False)).saga == run.saga
    assert run.state is S.UNCORDON_REQUIRED  # the node was never cordoned: the untaint ends it
    run.feed(kube.NodeUntainted(action_id=run.step_id))
    assert run.state is S.UPGRADE_DONE
    assert run.saga.history[-1].detail == f"{DRIVER_NOT_READY_TAINT} removed"


def test_a_failed_bring_up_keeps_the_taint_with_the_reason() -> None:
    run = Run(policy(), new_node())
    run.admit()
    run.until(S.VALIDATION_REQUIRED)
    run.fail("no GPU answered")
    run.until(S.UPGRADE_FAILED)
    issued = [a for d in run.decisions for a in d.kube_actions]
    assert not any(isinstance(a, actions.Untaint | actions.Uncordon) for a in issued)
    assert run.saga.failure is not None and "no GPU answered" in run.saga.failure.reason
    warnings = [a for a in issued if isinstance(a, actions.RecordEvent) and a.warning]
    assert any("no GPU answered" in a.message for a in warnings)


def test_a_node_with_gpu_pods_and_no_driver_goes_the_upgrade_path() -> None:
    saga = new_node().model_copy(update={"bring_up": False})
    run = Run(policy(), saga)
    run.admit()
    run.until(S.POD_DELETION_REQUIRED)
    assert run.saga.cordoned
    assert any(isinstance(a, actions.Cordon) for d in run.decisions for a in d.kube_actions)
