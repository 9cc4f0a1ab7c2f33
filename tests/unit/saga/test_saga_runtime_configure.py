"""The runtime-configure step in the decision core: with `upgradePolicy.configureRuntime`,
driver-reload-required ends by asking the driver-manager for the container runtime's
`nvidia` handler, inside the window (cordoned, drained, new driver loaded); its failure (a
runtime that did not come back, put back as it was by the agent) or its deadline rolls the
driver back like any failed step after the unload."""

from __future__ import annotations

from gpuop.events import driver as dm
from gpuop.saga.upgrade.steps import StepKind
from tests.support.sagas import Run, S, policy


def reload_tokens(run: Run) -> list[str]:
    return [r.step for r in run.saga.history if r.state is S.DRIVER_RELOAD_REQUIRED]


def to_runtime_step(**upgrade: object) -> Run:
    run = Run(policy(configure_runtime=True, **upgrade))
    run.admit()
    run.until(S.DRIVER_RELOAD_REQUIRED)
    while run.saga.step.kind is not StepKind.RUNTIME_CONFIGURE:
        run.ok()
    return run


def test_without_the_policy_no_runtime_step_is_taken() -> None:
    run = Run(policy())
    run.admit()
    run.until(S.UPGRADE_DONE)
    assert not any(isinstance(c.payload, dm.ConfigureRuntime) for c in run.commands())


def test_the_runtime_is_configured_after_the_loads_in_the_drained_window() -> None:
    run = to_runtime_step(ofed=True)
    assert run.state is S.DRIVER_RELOAD_REQUIRED
    run.until(S.UPGRADE_DONE)
    assert reload_tokens(run) == [
        "install-gpu",
        "install-ofed",
        "unload-gpu",
        "unload-ofed",
        "load-ofed",
        "load-gpu",
        "runtime-configure-gpu",
    ]
    states = run.states()
    assert states.index(S.DRAIN_REQUIRED) < states.index(S.DRIVER_RELOAD_REQUIRED)


def test_the_command_gets_half_the_executor_time_to_wait_for_the_answer() -> None:
    run = to_runtime_step(deadlines={"runtime_configure": 200})
    assert run.saga.deadline is not None
    assert (run.saga.deadline - run.saga.step_started).total_seconds() == 200
    commands = [c for c in run.commands() if isinstance(c.payload, dm.ConfigureRuntime)]
    assert [(c.step, c.payload.timeout_seconds) for c in commands] == [
        ("runtime-configure-gpu", 90)
    ]


def test_a_runtime_that_did_not_come_back_fails_the_step_into_the_rollback() -> None:
    run = to_runtime_step()
    run.fail("containerd did not answer within 90 s; earlier configuration restored")
    assert run.state is S.ROLLBACK_REQUIRED
    assert run.saga.failure is not None
    assert run.saga.failure.step == "runtime-configure-gpu"
    assert "did not answer" in run.saga.failure.reason


def test_a_runtime_step_past_its_deadline_rolls_back_too() -> None:
    run = to_runtime_step()
    run.expire()
    assert run.state is S.ROLLBACK_REQUIRED
    assert run.saga.failure is not None
    assert "runtime-configure-gpu did not finish" in run.saga.failure.reason
