"""The device-API switch kind, pure: its table and phases, the main line both ways, every
failure path with what it undoes, the deadlines, and what a new leader issues again."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from gpuop.events import dra, kube
from gpuop.events.device_api_commands import DeviceApi, DeviceApiApplied
from gpuop.events.driver import Component
from gpuop.events.kube import EvictionFailureReason, ValidationPodFailureReason
from gpuop.saga.actions import Cordon, DeletePods, RecordEvent, RunValidationPod, Uncordon
from gpuop.saga.device_api import folding, kind, phases
from gpuop.saga.device_api.states import TABLE, DeviceApiState
from gpuop.saga.machine import IllegalTransition, Kind, deadline_event
from gpuop.saga.registry import kind_named
from tests.support.device_api_sagas import NODE, VALIDATOR, SwitchRun

S = DeviceApiState
D = DeviceApi


def kinds_of(run: SwitchRun) -> list[type]:
    return [type(a) for a in run.actions() if not isinstance(a, RecordEvent)]


def test_every_state_has_one_phase_module_and_the_kind_is_registered():
    states = [module.STATE for module in phases.MODULES]
    assert sorted(states) == sorted(DeviceApiState)
    kind.DEVICE_API.check()
    assert kind_named("device-api") is folding.KIND
    assert folding.KIND.key(NODE) == f"device-api.{NODE}"


def test_a_kind_missing_a_phase_is_refused_and_a_move_the_table_lacks_raises():
    partial = dict(kind.DEVICE_API.phases)
    del partial[S.SWITCH_BACK_REQUIRED]
    with pytest.raises(ValueError, match="switch-back-required"):
        Kind(**{**vars(kind.DEVICE_API), "phases": MappingProxyType(partial)}).check()
    run = SwitchRun()
    draft = kind.Draft(kind.DEVICE_API, run.saga, run.policy, run.now)
    with pytest.raises(IllegalTransition, match="device-api-switch-required -> api-switch"):
        draft.move(S.API_SWITCH_REQUIRED, "skipping the drain")


def test_to_dra_cordons_drains_switches_validates_with_a_claim_and_uncordons():
    run = SwitchRun(D.DRA, D.DEVICE_PLUGIN)
    assert run.state is S.SWITCH_REQUIRED and run.decisions[0].kube_actions == ()
    run.until(S.DONE)
    assert run.states() == [
        S.CORDON_REQUIRED,
        S.DRAIN_REQUIRED,
        S.API_SWITCH_REQUIRED,
        S.VALIDATION_REQUIRED,
        S.UNCORDON_REQUIRED,
        S.DONE,
    ]
    assert kinds_of(run) == [Cordon, DeletePods, RunValidationPod, Uncordon]
    (drain,) = [a for a in run.actions() if isinstance(a, DeletePods)]
    assert drain.components == (Component.GPU,)
    (pod,) = [a for a in run.actions() if isinstance(a, RunValidationPod)]
    assert pod.device_class == dra.DRIVER
    assert [c.api for c in run.commands()] == [D.DRA]
    assert run.saga.failure is None and not run.saga.cordoned


def test_to_the_device_plugin_validates_with_an_nvidia_com_gpu_pod():
    run = SwitchRun(D.DEVICE_PLUGIN, D.DRA)
    run.until(S.DONE)
    (pod,) = [a for a in run.actions() if isinstance(a, RunValidationPod)]
    assert pod.device_class == ""
    assert [c.api for c in run.commands()] == [D.DEVICE_PLUGIN]


def test_answers_to_other_commands_and_the_plugins_own_changes_change_nothing():
    run = SwitchRun()
    run.until(S.API_SWITCH_REQUIRED)
    saga = run.saga
    own = DeviceApiApplied(api=D.DRA, serving=True)
    other = DeviceApiApplied(api=D.DRA, serving=True, command_id="f" * 32)
    for event in (own, other):
        assert run.feed(event).saga.state is S.API_SWITCH_REQUIRED
    assert run.saga.history == saga.history
    assert folding.step(run.saga, own, run.policy, run.now) is None


def test_a_switch_the_kubelet_refuses_switches_back_uncordons_and_fails():
    run = SwitchRun()
    run.until(S.API_SWITCH_REQUIRED)
    run.answer(D.DRA, serving=False, message="kubelet: plugin registration refused")
    assert run.state is S.SWITCH_BACK_REQUIRED
    assert [c.api for c in run.commands()] == [D.DRA, D.DEVICE_PLUGIN]
    run.until(S.FAILED)
    assert run.states()[-3:] == [S.SWITCH_BACK_REQUIRED, S.UNCORDON_REQUIRED, S.FAILED]
    reason = run.decisions[-1].transitions[-1].reason
    assert "registration refused" in reason and "device-plugin is served again" in reason
    assert kinds_of(run)[-1] is Uncordon
    assert run.saga.switched_back is True and not run.saga.cordoned


def test_an_answer_serving_the_other_api_is_a_failure_too():
    run = SwitchRun()
    run.until(S.API_SWITCH_REQUIRED)
    run.answer(D.DEVICE_PLUGIN, serving=True)
    assert run.state is S.SWITCH_BACK_REQUIRED
    assert run.saga.failure is not None and "device-plugin serving" in run.saga.failure.reason


def test_a_failed_validation_pod_switches_back():
    run = SwitchRun()
    run.until(S.VALIDATION_REQUIRED)
    failed = kube.ValidationPodFailed(
        action_id=run.step_id, pod=VALIDATOR, reason=ValidationPodFailureReason.TIMEOUT,
        message="claim not allocated",
    )  # fmt: skip
    run.feed(failed)
    assert run.state is S.SWITCH_BACK_REQUIRED
    run.until(S.FAILED)
    assert "claim not allocated" in run.decisions[-1].transitions[-1].reason


def test_a_switch_back_that_fails_too_leaves_the_node_cordoned_and_failed():
    run = SwitchRun()
    run.until(S.API_SWITCH_REQUIRED)
    run.expire()
    assert run.state is S.SWITCH_BACK_REQUIRED
    run.expire()
    assert run.state is S.FAILED
    assert Uncordon not in kinds_of(run)
    assert run.saga.cordoned and run.saga.switched_back is False
    reason = run.decisions[-1].transitions[-1].reason
    assert "switch did not finish" in reason and "left cordoned" in reason


def test_pods_that_stay_fail_the_switch_before_any_command_and_uncordon():
    run = SwitchRun()
    run.until(S.DRAIN_REQUIRED)
    failed = kube.PodDeletionFailed(
        action_id=run.step_id, reason=EvictionFailureReason.PDB_BLOCKED, pods=(VALIDATOR,)
    )
    run.feed(failed)
    assert run.state is S.UNCORDON_REQUIRED
    run.until(S.FAILED)
    assert run.commands() == []
    assert kinds_of(run) == [Cordon, DeletePods, Uncordon]


def test_a_cordon_not_confirmed_fails_with_nothing_else_done():
    run = SwitchRun()
    run.until(S.CORDON_REQUIRED)
    run.expire()
    assert run.state is S.FAILED
    assert kinds_of(run) == [Cordon] and run.commands() == []


def test_a_node_cordoned_before_stays_cordoned():
    run = SwitchRun()
    run.until(S.CORDON_REQUIRED)
    run.ok(was_unschedulable=True)
    run.until(S.DONE)
    assert Uncordon not in kinds_of(run)


def test_a_removed_node_fails_the_switch_whatever_it_was_doing():
    run = SwitchRun()
    run.until(S.VALIDATION_REQUIRED)
    run.feed(kube.NodeRemoved())
    assert run.state is S.FAILED and run.decisions[-1].kube_actions[-1].warning


def test_every_wait_but_admission_has_a_deadline_and_a_stale_one_changes_nothing():
    run = SwitchRun()
    assert run.saga.deadline is None
    run.until(S.DRAIN_REQUIRED)
    assert run.saga.deadline is not None
    stale = run.saga
    run.ok()
    old = deadline_event(stale)
    assert old is not None
    assert run.feed(old).saga == run.saga


def test_a_new_leader_issues_the_pending_step_again_with_the_same_ids():
    run = SwitchRun()
    run.until(S.API_SWITCH_REQUIRED)
    first = run.decisions[-1].commands
    again = kind.pending(run.saga, run.policy)
    assert again.commands == first
    restored = folding.KIND.decode(run.saga.to_json())
    assert restored == run.saga


def test_the_table_covers_exactly_the_moves_the_phases_make():
    made = set()
    for path in ("ok", "refused", "validation", "drain"):
        run = SwitchRun()
        if path == "refused":
            run.until(S.API_SWITCH_REQUIRED)
            run.answer(D.DRA, serving=False)
        elif path == "validation":
            run.until(S.VALIDATION_REQUIRED)
            run.expire()
        elif path == "drain":
            run.until(S.DRAIN_REQUIRED)
            run.expire()
        run.until(S.DONE if path == "ok" else S.FAILED)
        moves = [(t.from_state, t.to_state) for d in run.decisions for t in d.transitions]
        made |= set(moves)
    for source, target in made:
        assert target in TABLE[source]
