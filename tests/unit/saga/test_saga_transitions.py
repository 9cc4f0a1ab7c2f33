"""The transition table is complete, the core obeys it, and every edge is reachable."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpuop.events import kube
from gpuop.events.upgrade import UpgradeState
from gpuop.saga.upgrade import table
from gpuop.saga.upgrade.steps import StepKind
from gpuop.saga.upgrade.table import TABLE, IllegalTransition
from tests.support.sagas import BOOT_B, GPU_NEW, Run, S, inventory, policy, saga_for

Edge = tuple[UpgradeState, UpgradeState]


def test_every_state_has_a_row_and_every_edge_a_trigger():
    assert set(TABLE) == set(UpgradeState)
    for nexts in TABLE.values():
        assert all(trigger.strip() for trigger in nexts.values())
    assert TABLE[S.UPGRADE_DONE] == {}


def test_require_refuses_moves_absent_from_the_table():
    table.require(S.UPGRADE_REQUIRED, S.CORDON_REQUIRED)
    with pytest.raises(IllegalTransition):
        table.require(S.UPGRADE_REQUIRED, S.UPGRADE_DONE)
    with pytest.raises(IllegalTransition):
        table.require(S.UNCORDON_REQUIRED, S.CORDON_REQUIRED)


def _full(**upgrade):
    return policy(
        wait_for_completion={"pod_selector": "app=train"}, drain={"enable": True}, **upgrade
    )


def happy() -> Run:
    run = Run(_full())
    run.admit()
    run.until(S.UPGRADE_DONE)
    return run


def removed_in(state: UpgradeState) -> Callable[[], Run]:
    def scenario() -> Run:
        run = Run(_full())
        if state is not S.UPGRADE_REQUIRED:
            run.admit()
            run.until(state)
        run.feed(kube.NodeRemoved())
        return run

    return scenario


def failing_in(state: UpgradeState, *, with_drain: bool = True, **upgrade) -> Callable[[], Run]:
    def scenario() -> Run:
        run = Run(_full(**upgrade) if with_drain else policy(**upgrade))
        run.admit()
        run.until(state)
        run.fail()
        run.until(S.UPGRADE_FAILED)
        return run

    return scenario


def cordon_deadline_of_initially_cordoned() -> Run:
    spec = policy()
    run = Run(spec, saga_for(spec, unschedulable=True))
    run.admit()
    run.ok()  # staged
    run.expire()
    return run


def cordon_deadline() -> Run:
    run = Run(_full())
    run.admit()
    run.ok()  # staged
    assert run.saga.step.kind is StepKind.CORDON
    run.expire()
    run.until(S.UPGRADE_FAILED)
    return run


def broken_driver_then_failing_in(state: UpgradeState) -> Callable[[], Run]:
    """Attempt 1 leaves the driver touched (its rollback fails); attempt 2 fails early."""

    def scenario() -> Run:
        run = Run(_full())
        run.admit()
        run.until(S.VALIDATION_REQUIRED)
        run.fail("validation")
        run.fail("rollback")
        assert run.state is S.UPGRADE_FAILED and run.saga.touched
        run.expire()  # backoff
        run.admit()
        run.until(state)
        run.fail()
        return run

    return scenario


def reboot(then: Callable[[Run], None], **upgrade) -> Callable[[], Run]:
    def scenario() -> Run:
        run = Run(policy(reboot_on_unload_failure=True, **upgrade))
        run.admit()
        run.until(S.DRIVER_RELOAD_REQUIRED)
        run.ok()  # install
        run.fail("in use")
        then(run)
        return run

    return scenario


SCENARIOS: dict[str, Callable[[], Run]] = {
    "happy path": happy,
    "removed while waiting for admission": removed_in(S.UPGRADE_REQUIRED),
    "removed while waiting for jobs": removed_in(S.WAIT_FOR_JOBS_REQUIRED),
    "removed while deleting pods": removed_in(S.POD_DELETION_REQUIRED),
    "removed while draining": removed_in(S.DRAIN_REQUIRED),
    "removed while pausing": removed_in(S.OPERANDS_PAUSE_REQUIRED),
    "removed while rolling back": lambda: _removed_during_rollback(),
    "stage fails": failing_in(S.CORDON_REQUIRED),
    "cordon deadline": cordon_deadline,
    "cordon deadline, node cordoned before": cordon_deadline_of_initially_cordoned,
    "pod deletion fails without drain": failing_in(S.POD_DELETION_REQUIRED, with_drain=False),
    "drain fails": failing_in(S.DRAIN_REQUIRED),
    "pause deadline": failing_in(S.OPERANDS_PAUSE_REQUIRED),
    "install fails": failing_in(S.DRIVER_RELOAD_REQUIRED),
    "load fails, rollback": lambda: _load_fails(rollback=True),
    "load fails, no rollback": lambda: _load_fails(rollback=False),
    "validation fails, rollback": failing_in(S.VALIDATION_REQUIRED),
    "validation fails, no rollback": failing_in(S.VALIDATION_REQUIRED, rollback_on_failure=False),
    "uncordon deadline": failing_in(S.UNCORDON_REQUIRED),
    "cordon fails on a broken driver": broken_driver_then_failing_in(S.CORDON_REQUIRED),
    "pod deletion fails on a broken driver": lambda: _broken_then(S.POD_DELETION_REQUIRED),
    "drain fails on a broken driver": broken_driver_then_failing_in(S.DRAIN_REQUIRED),
    "pause fails on a broken driver": broken_driver_then_failing_in(S.OPERANDS_PAUSE_REQUIRED),
    "reboot confirmed": reboot(lambda run: run.until(S.UPGRADE_DONE)),
    "reboot into the targets": reboot(lambda run: run.feed(inventory(BOOT_B, gpu=GPU_NEW))),
    "reboot deadline, rollback": reboot(lambda run: run.expire()),
    "reboot deadline, no rollback": reboot(lambda run: run.expire(), rollback_on_failure=False),
    "retry after backoff": lambda: _retry(),
}


def _removed_during_rollback() -> Run:
    run = Run(policy())
    run.admit()
    run.until(S.VALIDATION_REQUIRED)
    run.fail()
    run.feed(kube.NodeRemoved())
    return run


def _load_fails(*, rollback: bool) -> Run:
    run = Run(policy(rollback_on_failure=rollback))
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    run.ok()  # install
    run.ok()  # unload
    run.fail("modprobe")
    run.until(S.UPGRADE_FAILED)
    return run


def _broken_then(state: UpgradeState) -> Run:
    run = Run(policy())  # no drain: a pod deletion failure compensates
    run.admit()
    run.until(S.VALIDATION_REQUIRED)
    run.fail("validation")
    run.fail("rollback")
    run.expire()
    run.admit()
    run.until(state)
    run.fail()
    return run


def _retry() -> Run:
    run = Run(policy())
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    run.fail()
    run.until(S.UPGRADE_FAILED)
    run.expire()
    run.admit()
    run.until(S.UPGRADE_DONE)
    return run


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_moves_only_along_the_table(name):
    run = SCENARIOS[name]()
    assert run.transitions()
    for move in run.transitions():
        assert table.allowed(*move), move


def test_the_scenarios_walk_every_transition_of_the_table():
    walked: set[Edge] = set()
    for scenario in SCENARIOS.values():
        walked.update(scenario().transitions())
    missing = table.edges() - walked
    assert not missing, sorted(missing)
    assert walked <= table.edges()
