"""A MIG mode NVML leaves pending until a reboot (`MigLayoutFailed` `mode-pending`): the MIG
saga reboots the node once, confirmed by a new boot id only, then applies the layout again
under a new command id; without a boot id, a second pending answer or a reboot that never
comes, the request fails (restoring the layout recorded at the start)."""

from __future__ import annotations

from gpuop.events import driver as dm
from gpuop.events import kube
from gpuop.events import mig_commands as migev
from gpuop.saga.machine import StepResult
from gpuop.saga.mig import folding, kind
from gpuop.saga.mig.actions import SetConfigState
from gpuop.saga.mig.records import MigStepKind
from gpuop.saga.mig.states import ConfigState, MigState
from tests.support.mig_sagas import MigRun

S = MigState
PENDING = migev.MigFailureReason.MODE_PENDING
BOOT_A = "6f0e6b1c-3a52-4b8e-9a1d-0c5c2f3e4d5a"
BOOT_B = "7f0e6b1c-3a52-4b8e-9a1d-0c5c2f3e4d5b"


def seen(boot_id: str) -> kube.NodeObserved:
    return kube.NodeObserved(ready=True, unschedulable=False, boot_id=boot_id)


def pending_run() -> MigRun:
    """A reconfiguration whose apply answered mode-pending, the node's boot id known."""
    run = MigRun()
    run.feed(seen(BOOT_A))
    run.until(S.APPLY_REQUIRED)
    run.apply_failed(restored=False, reason=PENDING)
    return run


def test_a_pending_mode_reboots_the_node_under_the_boot_id_it_was_decided_in() -> None:
    run = pending_run()

    assert run.state is S.REBOOT_REQUIRED and run.saga.step.kind is MigStepKind.REBOOT
    reboot = run.decisions[-1].commands[-1].payload
    assert isinstance(reboot, dm.RebootNode) and reboot.boot_id == BOOT_A
    assert run.saga.deadline is not None  # mig.deadlines.reboot
    labels = [a.value for a in run.actions() if isinstance(a, SetConfigState)]
    assert labels[-1] is ConfigState.REBOOTING


def test_only_a_new_boot_id_confirms_the_reboot_then_the_layout_is_applied_again() -> None:
    run = pending_run()
    first_apply = next(
        c.id for d in run.decisions for c in d.commands
        if isinstance(c.payload, migev.ApplyMigLayout)
    )  # fmt: skip
    run.feed(seen(BOOT_A))  # the boot the reboot was decided in: not rebooted yet
    assert run.state is S.REBOOT_REQUIRED

    run.feed(seen(BOOT_B))
    assert run.state is S.APPLY_REQUIRED and run.saga.step.kind is MigStepKind.REAPPLY
    again = run.decisions[-1].commands[-1]
    assert isinstance(again.payload, migev.ApplyMigLayout) and again.id != first_apply
    run.until(S.MIG_CONFIG_DONE)
    assert run.saga.rebooted and run.saga.boot_id == BOOT_B


def test_a_mode_still_pending_after_the_reboot_fails_the_request() -> None:
    run = pending_run()
    run.feed(seen(BOOT_B))
    run.apply_failed(restored=False, reason=PENDING)
    assert run.state is S.RESTORE_REQUIRED
    assert "still pending after the reboot" in run.saga.failure.reason  # type: ignore[union-attr]


def test_without_a_boot_id_a_pending_mode_fails_as_before() -> None:
    run = MigRun()
    run.until(S.APPLY_REQUIRED)
    run.apply_failed(restored=False, reason=PENDING)
    assert run.state is S.RESTORE_REQUIRED
    assert "no boot id known" in run.saga.failure.reason  # type: ignore[union-attr]


def test_a_reboot_that_never_comes_restores_the_layout_at_the_start() -> None:
    run = pending_run()
    run.expire()
    assert run.state is S.RESTORE_REQUIRED
    assert run.saga.history[-1].result is StepResult.EXPIRED


def test_the_start_event_carries_the_boot_id_so_a_replay_builds_the_same_saga() -> None:
    run = pending_run()
    saga = run.saga.model_copy(update={"boot_id": BOOT_A})
    rebuilt = folding.started(saga.node, folding.start_of(saga), saga.step_started)
    assert rebuilt.boot_id == BOOT_A
    replayed = MigRun()
    for trigger, at in run.triggers:
        decision = kind.decide(replayed.saga, trigger, run.policy, at)
        replayed.decisions.append(decision)
        replayed.saga = decision.saga
    assert replayed.decisions == run.decisions
