"""The MIG reconfiguration kind, pure: its table and phases, the main line, every failure
path with what it undoes, the deadlines, a request that cannot run, and a relabel while a
reconfiguration runs (queued behind it, never interleaved)."""

from __future__ import annotations

import importlib
import pkgutil
from datetime import timedelta
from types import MappingProxyType

import pytest

from gpuop.events import device as dev
from gpuop.events import ids, kube
from gpuop.events import mig_commands as migev
from gpuop.events import remediation_commands as rem
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.mig_requests import MigConfigRequested
from gpuop.saga import machine
from gpuop.saga.machine import IllegalTransition, Kind, StepResult
from gpuop.saga.mig import kind, phases
from gpuop.saga.mig.actions import EvictPods, RecordEvent, SetConfigState
from gpuop.saga.mig.records import MigSaga, MigStepKind
from gpuop.saga.mig.states import TABLE, ConfigState, MigState
from tests.support.mig_sagas import BALANCED, POD_A, POD_B, UUIDS, MigRun, inventory, policy

S = MigState


def labels(run: MigRun) -> list[ConfigState]:
    return [a.value for a in run.actions() if isinstance(a, SetConfigState)]


def test_every_mig_state_has_exactly_one_phase_module_named_for_it():
    found = {}
    for info in pkgutil.iter_modules(phases.__path__):
        module = importlib.import_module(f"{phases.__name__}.{info.name}")
        state = getattr(module, "STATE", None)
        if state is None:
            assert info.name == "common", f"{info.name} is neither a phase nor shared"
            continue
        assert info.name == state.value.replace("-", "_")
        assert state not in found
        found[state] = info.name
        assert phases.PHASES[state].effects is module.effects
    assert set(found) == set(MigState)
    kind.MIG.check()


def test_a_mig_kind_missing_a_phase_or_with_a_move_to_nowhere_is_refused():
    partial = dict(kind.MIG.phases)
    del partial[S.RESTORE_REQUIRED]
    with pytest.raises(ValueError, match="restore-required"):
        Kind(**{**vars(kind.MIG), "phases": MappingProxyType(partial)}).check()
    table = {state: dict(nexts) for state, nexts in TABLE.items()}
    table[S.MIG_CONFIG_DONE] = {S.APPLY_REQUIRED: " "}
    with pytest.raises(ValueError, match="bad move"):
        Kind(**{**vars(kind.MIG), "table": MappingProxyType(table)}).check()


def test_a_move_the_table_lacks_raises_instead_of_reaching_the_node():
    run = MigRun()
    draft = kind.Draft(kind.MIG, run.saga, run.policy, run.now)
    with pytest.raises(IllegalTransition, match="mig-config-required -> apply-required"):
        draft.move(S.APPLY_REQUIRED, "skipping the eviction")


def test_the_main_line_pauses_lists_evicts_only_the_holders_applies_verifies_and_resumes():
    run = MigRun("half-balanced")
    assert run.state is S.MIG_CONFIG_REQUIRED
    assert labels(run) == [ConfigState.PENDING]

    run.until(S.MIG_CONFIG_DONE)

    assert run.states() == [
        S.OPERANDS_PAUSE_REQUIRED,
        S.HOLDERS_EVICTION_REQUIRED,
        S.APPLY_REQUIRED,
        S.VERIFICATION_REQUIRED,
        S.OPERANDS_RESUME_REQUIRED,
        S.MIG_CONFIG_DONE,
    ]
    names = [type(c).__name__ for c in run.commands()]
    assert names == ["PauseOperands", "ListGpuHolders", "ApplyMigLayout", "ResumeOperands"]
    listing = run.commands()[1]
    assert listing.gpu_uuids == UUIDS[:2], "only the GPUs whose layout changes"
    (eviction,) = [a for a in run.actions() if isinstance(a, EvictPods)]
    assert eviction.pods == (POD_A,)
    apply = run.commands()[2]
    assert [(layout.gpu_index, layout.mig_enabled) for layout in apply.layouts] == [
        (0, True), (1, True), (2, False), (3, False),
    ]  # fmt: skip
    assert labels(run) == [ConfigState.PENDING, ConfigState.SUCCESS]
    assert run.saga.failure is None and not run.saga.operands_paused


def test_no_node_cordon_is_ever_ordered_the_pause_is_the_hold():
    run = MigRun()
    run.until(S.MIG_CONFIG_DONE)
    kinds = {type(a).__name__ for a in run.actions()}
    assert kinds == {"SetConfigState", "RecordEvent", "EvictPods"}
    pause = run.commands()[0]
    assert isinstance(pause, dev.PauseOperands)
    order = [type(c).__name__ for c in run.commands()]
    assert order.index("PauseOperands") < order.index("ListGpuHolders")


def test_no_holder_skips_the_eviction_as_a_recorded_step():
    run = MigRun()
    run.until(S.HOLDERS_EVICTION_REQUIRED)
    run.ok(holders=())
    assert run.state is S.APPLY_REQUIRED
    assert not [a for a in run.actions() if isinstance(a, EvictPods)]
    skipped = run.saga.history[-1]
    assert (skipped.step, skipped.result) == (MigStepKind.EVICT_HOLDERS, StepResult.SKIPPED)


def test_the_ids_are_the_same_when_the_same_step_is_decided_again():
    first, second = MigRun(), MigRun()
    first.until(S.APPLY_REQUIRED)
    second.until(S.APPLY_REQUIRED)
    assert [d.commands for d in first.decisions] == [d.commands for d in second.decisions]
    apply = first.decisions[-1].commands[-1]
    assert apply.id == ids.step(first.saga.saga_id, "apply", 1)
    again = kind.pending(first.saga, first.policy)
    assert again.commands == (apply,), "a new leader issues the apply under its first id"
    assert isinstance(again.kube_actions[0], SetConfigState)


def test_an_answer_to_another_step_or_saga_changes_nothing():
    run = MigRun()
    run.until(S.APPLY_REQUIRED)
    stale = migev.MigLayoutApplied(command_id="not-this-step", config="half-balanced")
    assert run.feed(stale).saga == run.decisions[-2].saga
    listing = rem.GpuHoldersListed(command_id=run.step_id, gpu_uuids=UUIDS[:1], pods=(POD_B,))
    assert run.feed(listing).transitions == ()
    assert run.state is S.APPLY_REQUIRED


def test_an_unknown_config_name_fails_at_once_with_the_names_it_could_have_been():
    run = MigRun("all-unbalanced")
    assert run.state is S.MIG_CONFIG_FAILED
    assert run.commands() == []
    reason = run.saga.failure.reason
    assert "nvidia.com/mig.config=all-unbalanced" in reason
    assert "no MIG config named 'all-unbalanced'" in reason
    assert "all-balanced, all-disabled, bad-index, first-two, half-balanced" in reason
    assert labels(run) == [ConfigState.FAILED]
    (event,) = [a for a in run.actions() if isinstance(a, RecordEvent)]
    assert event.warning and "all-unbalanced" in event.message


def test_a_config_that_does_not_fit_the_node_fails_at_once_naming_the_entry():
    run = MigRun("bad-index")
    assert run.state is S.MIG_CONFIG_FAILED
    assert "bad-index[0]: no GPU at index [9]" in run.saga.failure.reason


def test_a_request_that_changes_no_gpu_is_done_at_once_without_admission():
    run = MigRun("all-disabled")
    assert run.state is S.MIG_CONFIG_DONE
    assert run.commands() == [] and labels(run) == [ConfigState.SUCCESS]


def test_a_failed_apply_the_node_restored_resumes_the_operands_and_fails_with_why():
    run = MigRun()
    run.until(S.APPLY_REQUIRED)
    run.apply_failed(restored=True)
    assert run.state is S.OPERANDS_RESUME_REQUIRED
    run.ok()
    assert run.state is S.MIG_CONFIG_FAILED
    reason = run.decisions[-1].transitions[-1].reason
    assert "MigLayoutFailed apply-failed (the node restored the layout)" in reason
    assert "insufficient resources" in reason and "the layout at the start is back" in reason
    assert labels(run)[-1] is ConfigState.FAILED
    assert not run.saga.operands_paused


def test_a_failed_apply_not_restored_applies_the_layout_recorded_at_the_start():
    run = MigRun()
    run.until(S.APPLY_REQUIRED)
    run.apply_failed(restored=False)
    assert run.state is S.RESTORE_REQUIRED
    restore = run.decisions[-1].commands[-1].payload
    assert isinstance(restore, migev.ApplyMigLayout)
    assert [(lay.gpu_index, lay.mig_enabled, lay.devices) for lay in restore.layouts] == [
        (0, False, ()), (1, False, ()),
    ]  # fmt: skip
    run.ok()
    run.ok()
    assert run.state is S.MIG_CONFIG_FAILED
    assert run.saga.restored is True
    assert "the layout at the start is back" in run.decisions[-1].transitions[-1].reason


def test_a_restore_that_fails_too_ends_failed_saying_the_layout_is_not_back():
    run = MigRun()
    run.until(S.APPLY_REQUIRED)
    run.apply_failed(restored=False)
    run.apply_failed(restored=False)
    assert run.state is S.OPERANDS_RESUME_REQUIRED
    run.ok()
    assert run.state is S.MIG_CONFIG_FAILED
    assert run.saga.restored is False
    assert "could not be put back" in run.decisions[-1].transitions[-1].reason


def test_a_layout_the_saga_cannot_restore_itself_is_left_to_the_node_and_said_so():
    run = MigRun(node=inventory(0, 1))  # MIG on already: its devices are not known here
    assert not run.saga.plan.restorable
    run.until(S.APPLY_REQUIRED)
    run.apply_failed(restored=False)
    assert run.state is S.OPERANDS_RESUME_REQUIRED, "no restore it cannot describe"
    run.ok()
    assert run.state is S.MIG_CONFIG_FAILED and run.saga.restored is False


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ({"config": "all-balanced"}, "config all-balanced applied, half-balanced requested"),
        ({"changed_gpus": (0, 1, 7)}, "GPU(s) [7] changed though the request leaves them alone"),
        ({"mig_devices": 7}, "7 MIG devices on the node, 8 expected"),
    ],
)
def test_an_applied_layout_other_than_requested_is_restored(answer, problem):
    run = MigRun()
    run.until(S.APPLY_REQUIRED)
    run.feed(run.applied(**answer))
    assert run.state is S.RESTORE_REQUIRED
    assert problem in run.saga.failure.reason
    assert run.saga.failure.state is S.VERIFICATION_REQUIRED


def test_verification_counts_at_least_when_other_gpus_have_unreported_mig_devices():
    run = MigRun("first-two", node=inventory(2))  # GPU 2, left alone, has MIG devices
    run.until(S.APPLY_REQUIRED)
    run.feed(run.applied(devices=2 * BALANCED + 3))
    assert run.state is S.OPERANDS_RESUME_REQUIRED
    short = MigRun("first-two", node=inventory(2))
    short.until(S.APPLY_REQUIRED)
    short.feed(short.applied(devices=2 * BALANCED - 1))
    assert short.state is S.RESTORE_REQUIRED
    assert "7 MIG devices on the node, at least 8 expected" in short.saga.failure.reason
    exact = MigRun("first-two")
    exact.until(S.APPLY_REQUIRED)
    exact.feed(exact.applied(devices=2 * BALANCED + 3))
    assert "11 MIG devices on the node, 8 expected" in exact.saga.failure.reason


@pytest.mark.parametrize(
    ("state", "then"),
    [
        (S.OPERANDS_PAUSE_REQUIRED, S.OPERANDS_RESUME_REQUIRED),
        (S.HOLDERS_EVICTION_REQUIRED, S.OPERANDS_RESUME_REQUIRED),
        (S.APPLY_REQUIRED, S.RESTORE_REQUIRED),
        (S.RESTORE_REQUIRED, S.OPERANDS_RESUME_REQUIRED),
    ],
)
def test_every_wait_has_a_deadline_whose_expiry_compensates(state, then):
    run = MigRun()
    if state is S.RESTORE_REQUIRED:
        run.until(S.APPLY_REQUIRED)
        run.apply_failed(restored=False)
    run.until(state)
    limit = (run.saga.deadline - run.saga.step_started).total_seconds()
    run.expire()
    assert run.state is then
    assert f"did not finish within {limit:g} s" in run.saga.history[-1].detail
    assert run.saga.history[-1].result is StepResult.EXPIRED


def test_the_deadlines_come_from_the_policy():
    run = MigRun(spec=policy(deadlines={"apply": 42, "holders": 7}))
    run.until(S.HOLDERS_EVICTION_REQUIRED)
    assert run.saga.deadline - run.saga.step_started == timedelta(seconds=7)
    run.ok()
    run.ok()
    assert run.saga.deadline - run.saga.step_started == timedelta(seconds=42)
    assert run.decisions[-1].commands[-1].payload.timeout_seconds == 37


def test_a_stale_deadline_changes_nothing_and_admission_waits_without_one():
    run = MigRun()
    assert run.saga.deadline is None
    run.until(S.HOLDERS_EVICTION_REQUIRED)
    stale = DeadlineExpired(
        saga_id=run.saga.saga_id, state=S.OPERANDS_PAUSE_REQUIRED, step="operands-pause",
        attempt=1, deadline=run.now,
    )  # fmt: skip
    assert run.feed(stale).transitions == ()


def test_a_resume_that_never_confirms_fails_the_request_but_restores_nothing():
    run = MigRun()
    run.until(S.OPERANDS_RESUME_REQUIRED)
    run.feed(dev.OperandResumed(command_id=run.step_id, service=dev.OperandService.TELEMETRY))
    run.expire()
    assert run.state is S.MIG_CONFIG_FAILED
    assert "device-plugin, discovery did not confirm" in run.saga.failure.reason
    assert run.saga.restored is None
    assert not [c for c in run.commands() if isinstance(c, migev.ApplyMigLayout)][1:]


def test_holders_the_device_plugin_cannot_name_fail_before_anything_changes():
    run = MigRun()
    run.until(S.HOLDERS_EVICTION_REQUIRED)
    unknown = rem.GpuHoldersUnknown(command_id=run.step_id, message="PodResources refused")
    run.feed(unknown)
    assert run.state is S.OPERANDS_RESUME_REQUIRED
    run.ok()
    assert run.state is S.MIG_CONFIG_FAILED
    assert "cannot tell which pods hold the GPUs: PodResources refused" in (run.saga.failure.reason)
    assert not [c for c in run.commands() if isinstance(c, migev.ApplyMigLayout)]


def test_pods_that_stay_fail_the_request_naming_them():
    run = MigRun()
    run.until(S.HOLDERS_EVICTION_REQUIRED)
    run.ok(holders=(POD_A, POD_B))
    stayed = kube.PodDeletionFailed(
        action_id=run.step_id, reason=kube.EvictionFailureReason.PDB_BLOCKED, pods=(POD_B,)
    )
    run.feed(stayed)
    assert run.state is S.OPERANDS_RESUME_REQUIRED
    assert "stayed (pdb-blocked): ml/infer-b" in run.saga.failure.reason


def test_a_removed_node_ends_the_saga_from_any_state_and_an_ended_one_stays():
    for state in (S.MIG_CONFIG_REQUIRED, S.HOLDERS_EVICTION_REQUIRED, S.APPLY_REQUIRED):
        run = MigRun()
        run.until(state)
        run.feed(kube.NodeRemoved())
        assert run.state is S.MIG_CONFIG_FAILED
        assert run.decisions[-1].transitions[-1].reason == kind.NODE_REMOVED
    done = MigRun("all-disabled")
    assert done.feed(kube.NodeRemoved()).transitions == ()


def test_a_relabel_while_running_is_queued_not_interleaved_and_the_latest_wins():
    run = MigRun()
    run.until(S.APPLY_REQUIRED)
    run.feed(MigConfigRequested(config="all-balanced"))
    run.feed(MigConfigRequested(config="all-disabled"))
    assert run.saga.queued == "all-disabled"
    assert run.state is S.APPLY_REQUIRED, "the running request goes on"
    assert kind.next_request(run.saga) is None, "nothing starts before it ends"
    run.until(S.MIG_CONFIG_DONE)
    config, request = kind.next_request(run.saga)
    assert config == "all-disabled"
    assert request == kind.next_request(MigSaga.from_json(run.saga.to_json()))[1]
    assert [c.config for c in run.commands() if isinstance(c, migev.ApplyMigLayout)] == [
        "half-balanced"
    ]


def test_relabelling_back_to_the_running_config_or_removing_the_label_clears_the_queue():
    run = MigRun()
    run.admit()
    run.feed(MigConfigRequested(config="all-balanced"))
    run.feed(MigConfigRequested(config="half-balanced"))
    assert run.saga.queued is None
    run.feed(MigConfigRequested(config="all-balanced"))
    run.feed(MigConfigRequested(config=None))
    assert run.saga.queued is None


def test_the_record_round_trips_through_json_mid_flight():
    run = MigRun()
    run.until(S.APPLY_REQUIRED)
    run.feed(MigConfigRequested(config="all-balanced"))
    assert MigSaga.from_json(run.saga.to_json()) == run.saga


def test_replaying_the_recorded_triggers_through_a_fresh_kind_decides_the_same():
    run = MigRun()
    run.until(S.APPLY_REQUIRED)
    run.apply_failed(restored=False)
    run.until(S.MIG_CONFIG_FAILED)
    replayed = MigRun()
    for trigger, at in run.triggers:
        replayed.now = at
        replayed.decisions.append(decision := kind.decide(replayed.saga, trigger, run.policy, at))
        replayed.saga = decision.saga
    assert replayed.decisions == run.decisions
    assert replayed.saga == run.saga


def test_the_admission_only_moves_a_waiting_saga():
    run = MigRun()
    run.until(S.APPLY_REQUIRED)
    assert run.feed(machine.Admitted()).transitions == ()


def test_the_restore_puts_back_the_devices_discovery_reported_at_the_start():
    run = MigRun(node=inventory(devices={0: {"7g.141gb": 1}}))
    run.until(S.APPLY_REQUIRED)
    run.apply_failed(restored=False)
    restore = run.decisions[-1].commands[-1].payload
    first = restore.layouts[0]
    assert (first.gpu_index, first.mig_enabled) == (0, True)
    assert [(d.profile, d.count) for d in first.devices] == [("7g.141gb", 1)]


@pytest.mark.parametrize("end", [S.MIG_CONFIG_DONE, S.MIG_CONFIG_FAILED])
def test_an_ended_saga_has_its_final_step_and_no_deadline_left_to_expire(end):
    run = MigRun()
    run.until(S.APPLY_REQUIRED)
    assert run.saga.deadline is not None, "the apply waits under a deadline"
    if end is S.MIG_CONFIG_FAILED:
        run.apply_failed(restored=True)
    run.until(end)
    assert run.saga.deadline is None and machine.deadline_event(run.saga) is None
    final = MigStepKind.DONE if end is S.MIG_CONFIG_DONE else MigStepKind.FAILED
    assert (run.saga.step.kind, run.saga.step_started) == (final, run.now)


def test_a_command_or_action_takes_its_id_from_the_token_it_names_else_the_pending_step():
    run = MigRun()
    run.until(S.APPLY_REQUIRED)
    saga, resume = run.saga, dev.ResumeOperands(reason="r")
    assert machine.action_id(saga) == run.step_id == machine.issue(saga, resume).id
    other = ids.step(saga.saga_id, "operands-pause", saga.attempt)
    assert machine.action_id(saga, "operands-pause") == other
    issued = machine.issue(saga, resume, "operands-pause")
    assert (issued.id, issued.step, issued.attempt) == (other, "operands-pause", saga.attempt)
