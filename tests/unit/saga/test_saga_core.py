"""The decision core: the main line, reboots, rollback, compensation, retries, stale input."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpuop.events import device as dev
from gpuop.events import driver as dm
from gpuop.events import ids, kube
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.driver import Component
from gpuop.saga import actions
from gpuop.saga.upgrade import core, effects, records
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
    saga_for,
)

MAIN_LINE = [
    S.UPGRADE_REQUIRED,
    S.CORDON_REQUIRED,
    S.WAIT_FOR_JOBS_REQUIRED,
    S.POD_DELETION_REQUIRED,
    S.DRAIN_REQUIRED,
    S.OPERANDS_PAUSE_REQUIRED,
    S.DRIVER_RELOAD_REQUIRED,
    S.VALIDATION_REQUIRED,
    S.UNCORDON_REQUIRED,
    S.UPGRADE_DONE,
]


def full_policy(**upgrade):
    """Every optional wait on: a job selector and a drain."""
    return policy(
        wait_for_completion={"pod_selector": "app=training"}, drain={"enable": True}, **upgrade
    )


def test_happy_path_runs_every_state_with_exactly_the_expected_work():
    run = Run(full_policy())
    run.admit()
    run.until(S.UPGRADE_DONE)

    assert run.states() == MAIN_LINE
    assert run.work() == [
        "stage:gpu",
        "cordon",
        "deletepods",
        "drain",
        "pause",
        "install:gpu",
        "unload:gpu",
        "load:gpu",
        "validate:gpu",
        "validate-cuda:gpu",
        "resume",  # before the validation pod, so the device plugin advertises the GPUs
        "runvalidationpod",
        "uncordon",
    ]
    saga = run.saga
    assert saga.deadline is None and saga.failure is None and saga.touched == ()
    assert not saga.cordoned and not saga.operands_paused


def test_commands_carry_the_targets_and_ids_from_step_and_attempt():
    run = Run(full_policy())
    run.admit()
    run.until(S.UPGRADE_DONE)
    by_step = {c.step: c for c in run.commands()}

    for token, command in by_step.items():
        assert command.id == ids.step(run.saga.saga_id, token, 1)
        assert command.attempt == 1
    install = by_step["install-gpu"].payload
    assert isinstance(install, dm.InstallDriver)
    assert (install.version, install.source.uri) == (GPU_NEW, "/srv/drivers")
    assert install.timeout_seconds == int(900 * 0.9)  # 90% of deadlines.driverInstall
    load = by_step["load-gpu"].payload
    assert isinstance(load, dm.LoadDriver) and load.version == GPU_NEW
    validate = by_step["validate-gpu"].payload
    assert isinstance(validate, dm.ValidateDriver) and validate.version == GPU_NEW
    pause = by_step["operands-pause"].payload
    assert isinstance(pause, dev.PauseOperands) and pause.components == (Component.GPU,)
    assert isinstance(by_step["validate-resume"].payload, dev.ResumeOperands)


def test_kube_actions_carry_the_policy_options():
    spec = policy(
        pod_deletion={"force": True, "delete_empty_dir": True, "timeout_seconds": 100},
        drain={"enable": True, "pod_selector": "team=ml", "timeout_seconds": 200},
    )
    run = Run(spec)
    run.admit()
    run.until(S.OPERANDS_PAUSE_REQUIRED)
    deletes = [a for a in run.kube_actions() if isinstance(a, actions.DeletePods)]
    drains = [a for a in run.kube_actions() if isinstance(a, actions.Drain)]
    assert deletes == [
        actions.DeletePods(
            id=ids.step(run.saga.saga_id, "pod-deletion", 1),
            components=(Component.GPU,),
            force=True,
            timeout_seconds=90,
            delete_empty_dir=True,
        )
    ]
    assert drains[0].pod_selector == "team=ml" and drains[0].timeout_seconds == 180


def test_every_transition_sets_the_label_and_only_the_start_and_end_record_an_event():
    run = Run(full_policy())
    run.admit()
    run.until(S.UPGRADE_DONE)
    labels = [a for a in run.kube_actions() if isinstance(a, actions.SetStateLabel)]
    events = [a for a in run.kube_actions() if isinstance(a, actions.RecordEvent)]
    assert [label.value for label in labels] == MAIN_LINE[1:]
    assert [e.message.split(" (")[0] for e in events] == [
        "upgrade-required -> cordon-required",
        "uncordon-required -> upgrade-done",
    ]
    assert not any(e.warning for e in events)
    assert len({label.id for label in labels} | {e.id for e in events}) == len(labels) + 2


def test_state_changed_events_describe_each_transition():
    run = Run(policy(ofed=True))
    decision = run.admit()
    (transition,) = decision.transitions
    event = core.state_changed(decision.saga, transition)
    assert (event.from_state, event.to_state, event.attempt) == (
        S.UPGRADE_REQUIRED,
        S.CORDON_REQUIRED,
        1,
    )
    assert event.target_versions == {Component.GPU: GPU_NEW, Component.OFED: OFED_NEW}
    assert event.previous_versions == {Component.GPU: GPU_OLD, Component.OFED: OFED_OLD}


def test_same_inputs_make_the_same_decisions():
    first, second = Run(full_policy()), Run(full_policy())
    for run in (first, second):
        run.admit()
        run.until(S.UPGRADE_DONE)
    assert first.decisions == second.decisions


def test_deciding_again_after_a_crash_issues_the_same_ids():
    run = Run(full_policy())
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    before = run.saga
    event = run.driver_success(StepKind.INSTALL, Component.GPU, run.step_id)
    once = core.decide(before, event, run.policy, run.now)
    again = core.decide(before, event, run.policy, run.now)
    assert once == again
    (unload,) = once.commands
    assert unload.step == "unload-gpu"
    # the runtime re-issues a stored saga's pending step under the same ids
    reissued = upgrade.pending(once.saga, run.policy)
    assert reissued.commands == once.commands
    # and the public state change of the latest transition, in case it never went out
    entered = next(d for d in reversed(run.decisions) if d.transitions)
    assert once.transitions == () and reissued.transitions == entered.transitions
    assert entered.transitions[-1].to_state is S.DRIVER_RELOAD_REQUIRED


def test_pending_reissues_kube_actions_and_the_label():
    run = Run(policy())
    run.admit()
    (stage,) = upgrade.pending(run.saga, run.policy).commands
    assert isinstance(stage.payload, dm.StageDriver) and stage.step == "stage-gpu"
    decision = run.ok()
    reissued = upgrade.pending(run.saga, run.policy)
    cordon = [a for a in decision.kube_actions if isinstance(a, actions.Cordon)]
    assert cordon and cordon[0] in reissued.kube_actions
    assert actions.SetStateLabel(id=effects.label_id(run.saga), value=S.CORDON_REQUIRED) in (
        reissued.kube_actions
    )


def test_every_step_arms_its_deadline_from_the_policy():
    spec = policy(
        ofed=True,
        wait_for_completion={"pod_selector": "job=x", "timeout_seconds": 50},
        drain={"enable": True},
        deadlines={"cordon": 11, "operands_pause": 22, "driver_unload": 33, "uncordon": 44},
    )
    run = Run(spec)
    run.admit()
    seen: dict[str, float] = {}
    while run.state is not S.UPGRADE_DONE:
        saga = run.saga
        assert saga.deadline is not None, saga.step.token
        seen[saga.step.token] = (saga.deadline - saga.step_started).total_seconds()
        run.ok()
    assert seen == {
        "stage-gpu": 900,
        "stage-ofed": 900,
        "cordon": 11,
        "wait-for-jobs": 50,  # the upstream timeout, shorter than deadlines.waitForJobs
        "pod-deletion": 300,  # podDeletion.timeoutSeconds, shorter than the deadline
        "drain": 300,
        "operands-pause": 22,
        "install-gpu": 900,
        "install-ofed": 900,
        "unload-gpu": 33,
        "unload-ofed": 33,
        "load-ofed": 300,
        "load-gpu": 300,
        "validate-gpu": 600,
        "validate-ofed": 600,
        "validate-cuda-gpu": 300,
        "validate-resume": 22,
        "validate-pod": 600,
        "uncordon": 44,
    }


@pytest.mark.parametrize(
    ("stop_at", "expected"),
    [
        (S.CORDON_REQUIRED, S.UPGRADE_FAILED),  # stage-gpu: nothing cordoned, nothing to undo
        (S.DRAIN_REQUIRED, S.UNCORDON_REQUIRED),
        (S.OPERANDS_PAUSE_REQUIRED, S.UNCORDON_REQUIRED),
        (S.DRIVER_RELOAD_REQUIRED, S.UNCORDON_REQUIRED),  # install-gpu: nothing unloaded
        (S.VALIDATION_REQUIRED, S.ROLLBACK_REQUIRED),
        (S.UNCORDON_REQUIRED, S.UPGRADE_FAILED),
    ],
)
def test_a_deadline_fails_its_step(stop_at, expected):
    run = Run(full_policy())
    run.admit()
    run.until(stop_at)
    step = run.saga.step.token
    decision = run.expire()
    assert [t.to_state for t in decision.transitions] == [expected]
    assert run.saga.failure is not None and step in run.saga.failure.reason


@pytest.mark.parametrize(("drain", "expected"), [(True, S.DRAIN_REQUIRED), (False, None)])
def test_pod_deletion_deadline_drains_instead_when_drain_is_enabled(drain, expected):
    run = Run(policy(drain={"enable": drain}))
    run.admit()
    run.until(S.POD_DELETION_REQUIRED)
    decision = run.expire()
    if drain:
        assert [t.to_state for t in decision.transitions] == [expected]
        assert run.saga.failure is None
    else:
        assert run.state is S.UNCORDON_REQUIRED
        assert run.saga.failure is not None and "pod-deletion" in run.saga.failure.reason


def test_wait_for_jobs_deadline_goes_on_to_pod_deletion():
    run = Run(full_policy())
    run.admit()
    run.until(S.WAIT_FOR_JOBS_REQUIRED)
    run.feed(kube.PodsObserved(gpu_pods=1, job_pods=2, drainable_pods=3))
    assert run.state is S.WAIT_FOR_JOBS_REQUIRED
    run.expire()
    assert run.state is S.POD_DELETION_REQUIRED and run.saga.failure is None


def test_driver_step_deadlines_fail_into_rollback_once_a_driver_is_touched():
    run = Run(policy())
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    run.ok()  # install-gpu
    assert run.saga.step.token == "unload-gpu"
    run.expire()  # unanswered unload: the driver's state is unknown
    assert run.state is S.ROLLBACK_REQUIRED
    rollback_deadline = run.saga.deadline - run.saga.step_started
    assert rollback_deadline == timedelta(seconds=900)
    run.expire()
    assert run.state is S.UPGRADE_FAILED and run.saga.cordoned


def test_reboot_and_rollback_validation_deadlines():
    run = Run(policy(reboot_on_unload_failure=True))
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    run.ok()
    run.fail("nvidia in use by pid 42")
    assert run.state is S.REBOOT_REQUIRED
    assert run.saga.deadline - run.saga.step_started == timedelta(seconds=900)
    run.expire()  # no new boot id in time: a reboot is a touch, so roll back
    assert run.state is S.ROLLBACK_REQUIRED
    run.ok()
    assert run.state is S.VALIDATION_REQUIRED and run.saga.step.kind is StepKind.ROLLBACK_VALIDATE
    run.expire()
    assert run.state is S.UPGRADE_FAILED
    assert "reboot did not finish" in run.saga.last_error
    assert "rollback-validate-gpu did not finish" in run.saga.last_error


def test_unload_in_use_reboots_with_the_current_boot_id_when_allowed():
    run = Run(policy(reboot_on_unload_failure=True))
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    run.ok()
    decision = run.fail("in use")
    assert run.state is S.REBOOT_REQUIRED
    (reboot,) = decision.commands
    assert isinstance(reboot.payload, dm.RebootNode) and reboot.payload.boot_id == BOOT_A
    assert reboot.id == ids.step(run.saga.saga_id, "reboot", 1)
    assert [e.warning for e in decision.kube_actions if isinstance(e, actions.RecordEvent)] == [
        True
    ]


def test_reboot_is_confirmed_only_by_a_new_boot_id():
    run = Run(policy(reboot_on_unload_failure=True))
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    run.ok()
    run.fail("in use")
    reboot_started = run.feed(dm.RebootStarted(command_id=run.step_id, boot_id=BOOT_A), after=3000)
    assert reboot_started.transitions == () and run.state is S.REBOOT_REQUIRED
    # time alone, the same boot id, and observations without one confirm nothing
    for event in (
        kube.NodeObserved(ready=True, unschedulable=True, boot_id=BOOT_A),
        inventory(BOOT_A),
        kube.NodeObserved(ready=False, unschedulable=True),
    ):
        assert run.feed(event, after=600).transitions == ()
        assert run.state is S.REBOOT_REQUIRED
    run.feed(kube.NodeObserved(ready=True, unschedulable=True, boot_id=BOOT_B))
    assert run.state is S.DRIVER_RELOAD_REQUIRED
    assert run.saga.step.token == "unload-gpu-2" and run.saga.boot_id == BOOT_B
    run.until(S.UPGRADE_DONE)
    unloads = [c for c in run.commands() if isinstance(c.payload, dm.UnloadDriver)]
    assert [u.step for u in unloads] == ["unload-gpu", "unload-gpu-2"]
    assert unloads[0].id != unloads[1].id
    assert [c.step for c in run.commands() if isinstance(c.payload, dm.InstallDriver)] == [
        "install-gpu"
    ]


def test_a_reboot_into_the_targets_goes_straight_to_validation():
    run = Run(policy(reboot_on_unload_failure=True))
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    run.ok()
    run.fail("in use")
    run.feed(inventory(BOOT_B, gpu=GPU_NEW))
    assert run.state is S.VALIDATION_REQUIRED


def test_new_drivers_after_a_reboot_are_rolled_back_when_they_fail_validation():
    run = Run(policy(reboot_on_unload_failure=True))
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    run.ok()
    run.fail("in use")
    run.feed(inventory(BOOT_B, gpu=GPU_NEW))
    run.fail("XID 48")
    assert run.state is S.ROLLBACK_REQUIRED


def test_unload_in_use_without_reboot_policy_compensates():
    run = Run(policy(reboot_on_unload_failure=False))
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    run.ok()
    run.fail("nvidia in use")
    assert run.state is S.UNCORDON_REQUIRED  # the agent put the old driver back: untouched
    run.ok()
    assert run.state is S.UPGRADE_FAILED and "nvidia in use" in run.saga.last_error


def test_a_second_in_use_failure_after_a_reboot_fails_instead_of_rebooting_again():
    run = Run(policy(reboot_on_unload_failure=True))
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    run.ok()
    run.fail("in use")
    run.ok()  # new boot id
    run.fail("still in use")
    assert run.state is S.UNCORDON_REQUIRED
    assert sum(isinstance(c.payload, dm.RebootNode) for c in run.commands()) == 1


def test_no_reboot_without_a_known_boot_id():
    spec = policy(reboot_on_unload_failure=True)
    run = Run(spec, saga_for(spec, boot_id=None))
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    run.ok()
    run.fail("in use")
    assert run.state is S.UNCORDON_REQUIRED


def test_validation_failure_rolls_back_validates_and_only_then_uncordons():
    run = Run(policy())
    run.admit()
    run.until(S.VALIDATION_REQUIRED)
    run.fail("XID 79 on GPU 3")
    assert run.state is S.ROLLBACK_REQUIRED
    run.until(S.UPGRADE_FAILED)

    assert run.states()[-4:] == [
        S.ROLLBACK_REQUIRED,
        S.VALIDATION_REQUIRED,
        S.UNCORDON_REQUIRED,
        S.UPGRADE_FAILED,
    ]
    work = run.work()
    assert work[work.index("validate:gpu") :] == [
        "validate:gpu",
        "rollback:gpu",
        "validate:gpu",
        "resume",
        "uncordon",
    ]
    rollback = next(c for c in run.commands() if isinstance(c.payload, dm.RollbackDriver))
    assert rollback.payload.version == GPU_OLD
    revalidate = [c for c in run.commands() if c.step == "rollback-validate-gpu"]
    assert revalidate[0].payload.version == GPU_OLD
    saga = run.saga
    assert "XID 79 on GPU 3" in saga.last_error and saga.failure is not None
    assert not saga.cordoned and not saga.operands_paused and saga.touched == ()


def test_a_rollback_and_the_failure_are_recorded_as_warning_events():
    run = Run(policy())
    run.admit()
    run.until(S.VALIDATION_REQUIRED)
    run.fail("XID 79 on GPU 3")
    run.until(S.UPGRADE_FAILED)

    events = [a for a in run.kube_actions() if isinstance(a, actions.RecordEvent)]
    assert [(e.message.split(" (")[0], e.warning) for e in events] == [
        ("upgrade-required -> cordon-required", False),
        ("validation-required -> rollback-required", True),
        ("uncordon-required -> upgrade-failed", True),
    ]


def test_validation_failure_without_rollback_leaves_the_node_cordoned():
    run = Run(policy(rollback_on_failure=False))
    run.admit()
    run.until(S.VALIDATION_REQUIRED)
    decision = run.fail("XID 79")
    assert run.state is S.UPGRADE_FAILED
    assert decision.commands == ()
    assert not any(isinstance(a, actions.Uncordon) for a in decision.kube_actions)
    assert run.saga.cordoned and run.saga.operands_paused
    assert "rollback disabled" in run.saga.last_error


def test_a_failed_rollback_leaves_the_node_cordoned_with_both_reasons():
    run = Run(policy())
    run.admit()
    run.until(S.VALIDATION_REQUIRED)
    run.fail("XID 79")
    run.fail("package gone")
    assert run.state is S.UPGRADE_FAILED and run.saga.cordoned
    assert "XID 79" in run.saga.last_error and "package gone" in run.saga.last_error


def test_failure_before_the_unload_uncordons_and_resumes():
    run = Run(policy())
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    decision = run.fail("no such package")  # install-gpu: nothing unloaded yet
    assert run.state is S.UNCORDON_REQUIRED
    assert [c.step for c in decision.commands] == ["operands-resume"]
    assert any(isinstance(a, actions.Uncordon) for a in decision.kube_actions)
    run.ok()
    assert run.state is S.UPGRADE_FAILED
    assert run.saga.last_error.startswith("DriverInstallFailed gpu: no such package")
    assert not run.saga.cordoned


def test_failure_before_the_pause_uncordons_without_resuming():
    run = Run(policy(drain={"enable": True}))
    run.admit()
    run.until(S.DRAIN_REQUIRED)
    decision = run.fail("pdb default/web")
    assert run.state is S.UNCORDON_REQUIRED and decision.commands == ()
    run.ok()
    assert run.state is S.UPGRADE_FAILED and "pdb default/web" in run.saga.last_error


def test_pod_deletion_failure_drains_when_drain_is_enabled():
    run = Run(policy(drain={"enable": True}))
    run.admit()
    run.until(S.POD_DELETION_REQUIRED)
    run.fail()
    assert run.state is S.DRAIN_REQUIRED and run.saga.failure is None


def test_initially_cordoned_node_stays_cordoned():
    spec = policy()
    run = Run(spec, saga_for(spec, unschedulable=True))
    run.admit()
    run.until(S.UPGRADE_DONE)
    assert "uncordon" not in run.work() and "resume" in run.work()
    assert run.states()[-2:] == [S.UNCORDON_REQUIRED, S.UPGRADE_DONE]


def test_node_seen_cordoned_before_admission_is_never_uncordoned():
    run = Run(policy())
    run.feed(kube.NodeObserved(ready=True, unschedulable=True, boot_id=BOOT_A))
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    run.fail("no such package")
    assert run.state is S.UPGRADE_FAILED
    assert "uncordon" not in run.work()


def test_cordon_result_saying_already_cordoned_marks_the_node():
    run = Run(policy())
    run.admit()
    run.ok()  # staged
    run.feed(kube.NodeCordoned(action_id=run.step_id, was_unschedulable=True))
    assert run.saga.initially_unschedulable


def test_failed_node_retries_after_the_backoff_with_the_next_attempt():
    run = Run(policy(retry={"max_attempts": 2, "backoff_seconds": 30}))
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    run.fail("no such package")
    run.ok()  # compensation uncordons
    saga = run.saga
    assert saga.state is S.UPGRADE_FAILED and saga.step.kind is StepKind.BACKOFF
    assert saga.retry_at == run.now + timedelta(seconds=30) == saga.deadline
    decision = run.expire()
    assert [(t.to_state, t.attempt) for t in decision.transitions] == [(S.UPGRADE_REQUIRED, 2)]
    assert run.saga.failure is None and run.saga.last_error
    run.admit()
    assert run.step_id == ids.step(run.saga.saga_id, "stage-gpu", 2)  # staged again
    decision = run.ok()
    cordon = next(a for a in decision.kube_actions if isinstance(a, actions.Cordon))
    assert cordon.id == ids.step(run.saga.saga_id, "cordon", 2)
    run.until(S.DRIVER_RELOAD_REQUIRED)
    run.fail("no such package")
    run.ok()
    assert run.state is S.UPGRADE_FAILED and run.saga.step.kind is StepKind.FAILED
    assert run.saga.deadline is None and run.saga.retry_at is None


def test_backoff_grows_with_the_attempt():
    run = Run(policy(retry={"max_attempts": 5, "backoff_seconds": 10, "max_backoff_seconds": 25}))
    waits = []
    run.admit()
    for _ in range(4):
        run.until(S.DRIVER_RELOAD_REQUIRED)
        run.fail()
        run.ok()
        waits.append((run.saga.deadline - run.now).total_seconds())
        run.expire()
        run.admit()
    assert waits == [10, 20, 25, 25]


def test_a_driver_left_broken_is_never_uncordoned_on_a_later_early_failure():
    run = Run(policy(rollback_on_failure=False, drain={"enable": True}))
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    run.ok()  # install
    run.ok()  # unload
    run.fail("modprobe failed")  # load
    assert run.state is S.UPGRADE_FAILED and run.saga.touched == (Component.GPU,)
    run.expire()
    run.admit()
    run.until(S.DRAIN_REQUIRED)
    run.fail("pdb")
    assert run.state is S.UPGRADE_FAILED
    assert "uncordon" not in run.work()


def test_stale_deadlines_are_ignored():
    run = Run(full_policy())
    run.admit()
    old = core.deadline_event(run.saga)
    assert old is not None
    run.ok()  # cordoned: the cordon deadline is stale now
    before = run.saga
    for stale in (
        old,
        old.model_copy(update={"state": before.state, "step": before.step.token, "attempt": 2}),
        old.model_copy(update={"state": before.state, "step": "drain"}),
        DeadlineExpired(
            saga_id="other/node",
            state=before.state,
            step=before.step.token,
            attempt=1,
            deadline=T0,
        ),
    ):
        decision = run.feed(stale, after=5000)
        assert decision.saga == before and decision.transitions == () and not decision.commands


def test_results_of_other_commands_are_ignored():
    run = Run(policy())
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    install_id = run.step_id
    run.ok()
    before = run.saga
    for stale in (
        dm.DriverInstalled(command_id=install_id, component=Component.GPU, version=GPU_NEW),
        dm.DriverUnloaded(command_id="not-ours", component=Component.GPU),
        kube.NodeCordoned(action_id="not-ours"),
        dev.OperandPaused(command_id="not-ours", service=dev.OperandService.TELEMETRY),
    ):
        decision = run.feed(stale)
        assert decision.saga == before and decision.transitions == ()


def test_gpu_and_ofed_share_one_window_in_dependency_order():
    run = Run(policy(ofed=True))
    run.admit()
    run.until(S.UPGRADE_DONE)
    assert run.states() == [s for s in MAIN_LINE]
    assert run.work() == [
        "stage:gpu",
        "stage:ofed",
        "cordon",
        "deletepods",
        "pause",
        "install:gpu",
        "install:ofed",
        "unload:gpu",
        "unload:ofed",
        "load:ofed",
        "load:gpu",
        "validate:gpu",
        "validate:ofed",
        "validate-cuda:gpu",
        "resume",
        "runvalidationpod",
        "uncordon",
    ]
    pause = next(c for c in run.commands() if isinstance(c.payload, dev.PauseOperands))
    assert pause.payload.components == (Component.GPU, Component.OFED)


@pytest.mark.parametrize("allowed", [False, True])
def test_only_an_ofed_unload_carries_the_management_nic_opt_in(allowed):
    spec = policy(ofed=True)
    spec = spec.model_validate({**spec.to_wire(), "network": {"allowManagementNicReload": allowed}})
    run = Run(spec)
    run.admit()
    run.until(S.UPGRADE_DONE)
    unloads = {
        c.payload.component: c.payload.allow_management_interface
        for c in run.commands()
        if isinstance(c.payload, dm.UnloadDriver)
    }
    assert unloads == {Component.GPU: False, Component.OFED: allowed}


def test_ofed_failure_after_gpu_unload_rolls_back_only_what_was_touched():
    run = Run(policy(ofed=True))
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    run.ok()  # install gpu
    run.ok()  # install ofed
    run.ok()  # unload gpu
    run.feed(
        dm.DriverUnloadFailed(
            command_id=run.step_id,
            component=Component.OFED,
            reason=dm.UnloadFailureReason.MANAGEMENT_INTERFACE,
            message="eth0 carries the default route",
        )
    )
    assert run.state is S.ROLLBACK_REQUIRED
    run.until(S.UPGRADE_FAILED)
    assert [c.step for c in run.commands() if isinstance(c.payload, dm.RollbackDriver)] == [
        "rollback-gpu"
    ]
    assert "default route" in run.saga.last_error


def test_a_touched_component_without_a_previous_version_keeps_the_node_cordoned():
    spec = policy(ofed=True)
    saga = records.new_saga(
        node="n1",
        rollout_id="r",
        policy=spec,
        running={Component.GPU: GPU_OLD, Component.OFED: None},
        now=T0,
    )
    run = Run(spec, saga)
    run.admit()
    run.until(S.VALIDATION_REQUIRED)
    run.fail("XID 79")
    assert run.state is S.ROLLBACK_REQUIRED
    run.until(S.UPGRADE_FAILED)
    assert [c.step for c in run.commands() if isinstance(c.payload, dm.RollbackDriver)] == [
        "rollback-gpu"
    ]
    assert "uncordon" not in run.work() and run.saga.touched == (Component.OFED,)
    assert "no previous version of ofed" in run.saga.last_error


def test_only_changed_components_are_reloaded():
    spec = policy(ofed=True)
    saga = saga_for(spec).model_copy()
    fresh = records.new_saga(
        node="n1",
        rollout_id="r",
        policy=spec,
        running={Component.GPU: GPU_OLD, Component.OFED: OFED_NEW},
        now=T0,
    )
    assert saga.components == (Component.GPU, Component.OFED)
    assert fresh.components == (Component.GPU,)
    run = Run(spec, fresh)
    run.admit()
    run.until(S.UPGRADE_DONE)
    assert not any(":ofed" in w for w in run.work())


def test_without_a_source_the_install_is_left_to_the_host():
    run = Run(policy(source=None))
    run.admit()
    run.until(S.UPGRADE_DONE)
    assert "install:gpu" not in run.work() and "load:gpu" in run.work()


def test_removed_node_ends_failed_without_retry():
    run = Run(policy(drain={"enable": True}))
    run.admit()
    run.until(S.DRAIN_REQUIRED)
    decision = run.feed(kube.NodeRemoved())
    assert run.state is S.UPGRADE_FAILED and run.saga.deadline is None
    assert decision.commands == ()
    assert not any(isinstance(a, actions.Uncordon) for a in decision.kube_actions)


def test_removed_node_cancels_a_pending_retry():
    run = Run(policy())
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    run.fail()
    run.ok()
    assert run.saga.step.kind is StepKind.BACKOFF
    decision = run.feed(kube.NodeRemoved())
    assert decision.transitions == () and run.saga.deadline is None
    assert core.deadline_event(run.saga) is None


def test_done_saga_ignores_everything():
    run = Run(policy())
    run.admit()
    run.until(S.UPGRADE_DONE)
    done = run.saga
    for event in (kube.NodeRemoved(), core.Admitted(), inventory(BOOT_B)):
        decision = run.feed(event)
        assert decision.transitions == () and decision.commands == ()
    assert run.saga.state is S.UPGRADE_DONE and run.saga.touched == done.touched


def test_operands_pause_waits_for_every_operand_once():
    run = Run(policy())
    run.admit()
    run.until(S.OPERANDS_PAUSE_REQUIRED)
    pause_id = run.step_id
    for service in (dev.OperandService.DEVICE_PLUGIN, dev.OperandService.DEVICE_PLUGIN):
        run.feed(dev.OperandPaused(command_id=pause_id, service=service))
    run.feed(dev.OperandPaused(command_id=pause_id, service=dev.OperandService.TELEMETRY))
    assert run.state is S.OPERANDS_PAUSE_REQUIRED
    run.feed(dev.OperandPaused(command_id=pause_id, service=dev.OperandService.DISCOVERY))
    assert run.state is S.DRIVER_RELOAD_REQUIRED


def test_inventory_before_the_reload_refreshes_the_rollback_target():
    run = Run(policy())
    run.feed(inventory(BOOT_A, gpu="575.9"))
    assert run.saga.previous_versions[Component.GPU] == "575.9"
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    run.ok()
    run.ok()
    run.feed(inventory(BOOT_A, gpu=None))
    assert run.saga.previous_versions[Component.GPU] == "575.9"


def test_an_admission_that_leaves_ofed_out_upgrades_the_gpu_driver_alone():
    run = Run(policy(ofed=True))
    decision = run.feed(core.Admitted(components=(Component.GPU,)))
    assert run.saga.components == (Component.GPU,)
    assert set(run.saga.targets) == set(run.saga.previous_versions) == {Component.GPU}
    (moved,) = decision.transitions
    assert moved.reason == "admitted; ofed left out (nvidia.com/ofed-driver-upgrade.skip=true)"
    assert core.state_changed(run.saga, moved).components == (Component.GPU,)
    run.until(S.UPGRADE_DONE)
    assert [w for w in run.work() if ":" in w] == [
        "stage:gpu", "install:gpu", "unload:gpu", "load:gpu", "validate:gpu",
        "validate-cuda:gpu",
    ]  # fmt: skip
    (deletion,) = [a for a in run.kube_actions() if isinstance(a, actions.DeletePods)]
    assert deletion.components == (Component.GPU,)


def test_an_admission_keeps_a_component_a_failed_attempt_touched():
    touched = saga_for(policy(ofed=True)).model_copy(
        update={"attempt": 2, "touched": (Component.OFED,)}
    )
    run = Run(policy(ofed=True), touched)
    run.feed(core.Admitted(components=(Component.GPU,)))
    assert run.saga.components == (Component.GPU, Component.OFED)


def test_the_pod_deletion_names_every_component_of_the_window():
    run = Run(policy(ofed=True))
    run.admit()
    run.until(S.OPERANDS_PAUSE_REQUIRED)
    (deletion,) = [a for a in run.kube_actions() if isinstance(a, actions.DeletePods)]
    assert deletion.components == (Component.GPU, Component.OFED)
