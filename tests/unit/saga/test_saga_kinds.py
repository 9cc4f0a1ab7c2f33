"""Saga kinds: every upgrade state has its phase, and a second kind runs on the same
machinery (table checks, deadlines, ids, outcomes, admission's one budget) without touching
the upgrade's states."""

from __future__ import annotations

import importlib
import pkgutil
from datetime import datetime, timedelta
from enum import StrEnum
from types import MappingProxyType
from typing import Any

import pytest
from pydantic import AwareDatetime

from gpuop.events import ids, kube
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.driver import RebootNode
from gpuop.events.fields import Record
from gpuop.events.upgrade import UpgradeState
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import admission, machine
from gpuop.saga.admission import NodeStatus
from gpuop.saga.machine import Admitted, IllegalTransition, Kind, Phase, StepLike
from gpuop.saga.mig.records import MigStep, MigStepKind
from gpuop.saga.upgrade import phases, table
from gpuop.saga.upgrade.drafting import Draft
from gpuop.saga.upgrade.kind import UPGRADE
from tests.support.sagas import T0, Run, policy, saga_for


def test_every_upgrade_state_has_exactly_one_phase_module():
    found = {}
    for info in pkgutil.iter_modules(phases.__path__):
        module = importlib.import_module(f"{phases.__name__}.{info.name}")
        state = getattr(module, "STATE", None)
        if state is None:
            assert info.name == "common", f"{info.name} is neither a phase nor shared"
            continue
        assert state not in found, f"{state} has two modules: {found.get(state)}, {info.name}"
        assert info.name == state.value.replace("-", "_"), "a phase module is named for its state"
        found[state] = info.name
        for hook in ("enter", "on_event", "on_deadline", "effects"):
            assert callable(getattr(module, hook)), f"{info.name} lacks {hook}"
        assert phases.PHASES[state].effects is module.effects
    assert set(found) == set(UpgradeState)
    assert set(phases.PHASES) == set(UpgradeState)
    UPGRADE.check()


def test_a_kind_with_a_state_left_without_its_phase_is_refused():
    partial = dict(UPGRADE.phases)
    del partial[UpgradeState.REBOOT_REQUIRED]
    kind = Kind(**{**vars(UPGRADE), "phases": MappingProxyType(partial)})
    with pytest.raises(ValueError, match="reboot-required"):
        kind.check()


def test_the_upgrade_runs_through_the_phases_as_before():
    run = Run(policy())
    run.admit()
    run.until(UpgradeState.UPGRADE_DONE)
    order = [module.STATE for module in phases.MODULES]
    walked = run.states()
    assert walked == sorted(set(walked), key=order.index), "the main line, in phase order"
    assert {UpgradeState.DRIVER_RELOAD_REQUIRED, UpgradeState.UPGRADE_DONE} <= set(walked)


# A second kind, written as a remediation saga would be: its own states, table, record,
# phases and effects. Nothing of the upgrade's is touched.


class Reset(StrEnum):
    REQUIRED = "reset-required"
    RESETTING = "gpu-reset-required"
    DONE = "reset-done"
    FAILED = "reset-failed"


class Step(Record):
    name: str

    @property
    def token(self) -> str:
        return self.name


class ResetSaga(Record):
    saga_id: str
    node: str
    state: Reset = Reset.REQUIRED
    attempt: int = 1
    sequence: int = 0
    step: Step = Step(name="admission")
    step_started: AwareDatetime
    deadline: AwareDatetime | None = None
    last_transitions: tuple[machine.Transition[Reset], ...] = ()
    history: tuple[tuple[str, str, str], ...] = ()

    def ended(self, at: datetime, result: str, detail: str) -> ResetSaga:
        entry = (self.step.token, str(result), detail)
        return self.model_copy(update={"history": (*self.history, entry)})


BOOT = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"


def answer(command_id: str) -> kube.NodeUncordoned:
    """The toy kind's answer to its step: an action outcome carrying the step's id."""
    return kube.NodeUncordoned(action_id=command_id)


class Result(StrEnum):
    OK = "succeeded"
    EXPIRED = "expired"


class ResetDraft(machine.Draft[ResetSaga, Reset]):
    pass


def _enter_required(draft: ResetDraft, retry: bool) -> None:
    draft.start(Step(name="admission"))


def _on_required(draft: ResetDraft, trigger: machine.Trigger) -> None:
    if isinstance(trigger, Admitted):
        draft.move(Reset.RESETTING, "admitted")


def _enter_resetting(draft: ResetDraft, retry: bool) -> None:
    draft.start(Step(name="reset"))


def _on_resetting(draft: ResetDraft, trigger: machine.Trigger) -> None:
    if isinstance(trigger, kube.NodeUncordoned) and trigger.action_id == draft.step_id():
        draft.outcome(Result.OK, "reset")
        draft.move(Reset.DONE, "the GPU came back")


def _expired_resetting(draft: ResetDraft, expired: DeadlineExpired) -> None:
    draft.outcome(Result.EXPIRED, "no answer")
    draft.move(Reset.FAILED, "the reset did not finish")


def _enter_end(draft: ResetDraft, retry: bool) -> None:
    draft.start(Step(name="end"))


def _effects(saga: ResetSaga, spec: GPUClusterPolicySpec) -> machine.Effects:
    command = machine.IssuedCommand(
        payload=RebootNode(boot_id=BOOT, reason="reset the GPU"),
        id=ids.step(saga.saga_id, "reset", saga.attempt),
        step="reset",
        attempt=saga.attempt,
    )
    return (command,), ()


def _limit(saga: ResetSaga, step: StepLike, spec: GPUClusterPolicySpec) -> float | None:
    return 60.0 if step.token == "reset" else None


def _removed(draft: ResetDraft) -> None:
    draft.move(Reset.FAILED, "node removed", retry=False)


RESET: Kind[ResetSaga, Reset, ResetDraft] = Kind(
    name="gpu-reset",
    table={
        Reset.REQUIRED: {Reset.RESETTING: "admitted", Reset.FAILED: "node removed"},
        Reset.RESETTING: {Reset.DONE: "reset answered", Reset.FAILED: "deadline or removed"},
        Reset.DONE: {},
        Reset.FAILED: {},
    },
    phases={
        Reset.REQUIRED: Phase(_enter_required, _on_required, machine.ignore),
        Reset.RESETTING: Phase(_enter_resetting, _on_resetting, _expired_resetting, _effects),
        Reset.DONE: Phase(_enter_end, machine.ignore, machine.ignore),
        Reset.FAILED: Phase(_enter_end, machine.ignore, machine.ignore),
    },
    retry_state=Reset.REQUIRED,
    observe=lambda draft, event: None,
    removed=_removed,
    announce=lambda saga, transition: (f"label {transition.to_state}",),
    limit=_limit,
)


def _decide(
    saga: ResetSaga, trigger: Any, now: datetime = T0
) -> machine.Decision[ResetSaga, Reset]:
    return machine.decide(ResetDraft(RESET, saga, policy(), now), trigger).decision()


def _fresh() -> ResetSaga:
    return ResetSaga(saga_id="reset-1/gpu-node-1", node="gpu-node-1", step_started=T0)


def test_a_second_kind_moves_issues_and_answers_on_the_same_machinery():
    RESET.check()
    admitted = _decide(_fresh(), Admitted())
    saga = admitted.saga
    assert saga.state is Reset.RESETTING
    assert saga.sequence == 1 and saga.deadline == T0 + timedelta(seconds=60)
    assert [(t.from_state, t.to_state) for t in admitted.transitions] == [
        (Reset.REQUIRED, Reset.RESETTING)
    ]
    assert admitted.kube_actions == ("label gpu-reset-required",)
    (command,) = admitted.commands
    assert command.id == ids.step(saga.saga_id, "reset", 1)
    answered = _decide(saga, answer(command.id))
    assert answered.saga.state is Reset.DONE
    assert answered.saga.history[-1] == ("reset", "succeeded", "reset")
    assert answered.saga.last_transitions == answered.transitions


def test_a_second_kind_gets_its_deadlines_stale_ones_dropped():
    saga = _decide(_fresh(), Admitted()).saga
    assert saga.deadline is not None
    due = machine.deadline_event(saga)  # what the runtime's scheduler publishes, any kind
    assert due == DeadlineExpired(
        saga_id=saga.saga_id, state=saga.state, step="reset", attempt=1, deadline=saga.deadline
    )
    stale = due.model_copy(update={"attempt": 2})
    assert _decide(saga, stale).saga == saga
    assert _decide(saga, answer("someone-else")).saga == saga
    failed = _decide(saga, due, saga.deadline)
    assert failed.saga.state is Reset.FAILED
    assert failed.saga.history[-1][1] == "expired"


def test_a_second_kind_cannot_make_a_move_its_table_lacks():
    done = _fresh().model_copy(update={"state": Reset.DONE})
    draft = ResetDraft(RESET, done, policy(), T0)
    with pytest.raises(IllegalTransition, match="gpu-reset: no transition reset-done"):
        draft.move(Reset.RESETTING, "never")
    # the upgrade's table knows nothing of it, and is as it was
    assert not set(Reset) & set(table.TABLE)
    assert set(table.TABLE) == set(UpgradeState)


def test_a_kind_refuses_to_start_a_step_of_another_kind():
    spec = policy()
    draft = Draft(UPGRADE, saga_for(spec), spec, T0)
    with pytest.raises(TypeError, match="a step is a Step, not MigStep"):
        draft.start(MigStep(kind=MigStepKind.ADMISSION))


def test_a_node_another_kind_holds_is_unavailable_and_never_admitted():
    spec = policy(max_parallel_upgrades=2, max_unavailable=2)
    nodes = {f"node-{i}": NodeStatus() for i in range(4)}
    sagas = [saga_for(spec, node=name) for name in nodes]
    assert admission.admit(sagas, nodes, spec, T0) == ["node-0", "node-1"]
    nodes["node-0"] = NodeStatus(held_by="gpu-reset")
    result = admission.plan(sagas, nodes, spec, T0)
    assert result.unavailable == 1
    assert result.nodes == ("node-1",)  # one place of the budget is the reset's
