"""The operands' confirmations every kind's pause and resume count (`gpuop.saga.operands`)."""

from __future__ import annotations

from gpuop.events import device as dev
from gpuop.saga import operands
from gpuop.saga.mig import kind
from gpuop.saga.mig.states import MigState
from tests.support.mig_sagas import MigRun

SERVICES = tuple(dev.OperandService)


def pausing() -> kind.Draft:
    run = MigRun()
    run.until(MigState.OPERANDS_PAUSE_REQUIRED)
    assert run.saga.operands == SERVICES and run.saga.paused == ()
    return kind.Draft(kind.MIG, run.saga, run.policy, run.now)


def paused(draft: kind.Draft, service: dev.OperandService, command_id: str = "") -> bool:
    answer = dev.OperandPaused(command_id=command_id or draft.step_id(), service=service)
    return operands.count(draft, answer, dev.OperandPaused)


def test_each_operand_counts_once_in_the_sagas_order_and_the_last_one_completes():
    draft = pausing()
    last, *others = reversed(SERVICES)
    assert [paused(draft, service) for service in others] == [False] * len(others)
    assert draft.saga.paused == tuple(s for s in SERVICES if s != last)
    assert paused(draft, last) is True
    assert draft.saga.paused == SERVICES


def test_a_repeated_confirmation_counts_nothing_and_completes_nothing_again():
    draft = pausing()
    assert [paused(draft, service) for service in SERVICES][-1] is True
    before = draft.saga
    assert paused(draft, SERVICES[0]) is False, "the step completed once already"
    assert draft.saga == before


def test_another_steps_answer_or_the_other_kind_of_confirmation_changes_nothing():
    draft = pausing()
    before = draft.saga
    assert paused(draft, SERVICES[0], command_id="another-step") is False
    resumed = dev.OperandResumed(command_id=draft.step_id(), service=SERVICES[0])
    assert operands.count(draft, resumed, dev.OperandPaused) is False
    assert draft.saga == before


def test_an_operand_the_saga_does_not_wait_for_changes_nothing():
    draft = pausing()
    draft.update(operands=SERVICES[1:])
    assert [paused(draft, service) for service in SERVICES[1:]][-1] is True
    before = draft.saga
    assert paused(draft, SERVICES[0]) is False, "not an operand of this saga"
    assert draft.saga == before


def test_a_resume_counts_into_the_field_it_names():
    draft = pausing()
    answer = dev.OperandResumed(command_id=draft.step_id(), service=SERVICES[0])
    assert operands.count(draft, answer, dev.OperandResumed, "resumed") is False
    assert (draft.saga.resumed, draft.saga.paused) == (SERVICES[:1], ())
