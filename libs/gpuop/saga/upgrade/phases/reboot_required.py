"""reboot-required: the node is rebooted to release a driver in use; only a new boot id
confirms it, and the reload then runs again on the fresh boot (or validation, when the
boot came up on the target drivers)."""

from __future__ import annotations

from gpuop.events import hardware as hw
from gpuop.events.driver import Component
from gpuop.events.upgrade import UpgradeState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import reboots
from gpuop.saga.machine import Effects, StepResult, Trigger
from gpuop.saga.upgrade.drafting import Draft
from gpuop.saga.upgrade.effects import issue
from gpuop.saga.upgrade.phases.common import fail_on_deadline
from gpuop.saga.upgrade.records import NodeSaga
from gpuop.saga.upgrade.steps import Step, StepKind

STATE = S.REBOOT_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    draft.start(Step(kind=StepKind.REBOOT))


def on_event(draft: Draft, trigger: Trigger) -> None:
    boot_id = reboots.new_boot(draft.saga, trigger)
    if boot_id is None:
        return
    draft.update(boot_id=boot_id, reload_round=draft.saga.reload_round + 1)
    draft.outcome(StepResult.SUCCEEDED, f"new boot id {boot_id}")
    if isinstance(trigger, hw.HardwareDiscovered) and _runs_targets(draft, trigger):
        # the new drivers run but are not validated: they stay touched until they are
        draft.move(S.VALIDATION_REQUIRED, "rebooted into the target drivers")
    else:
        # the boot loaded the previous drivers again (a load selects the active version,
        # and no load ran before the unload failed): nothing of ours is left on the node
        draft.update(touched=())
        draft.move(S.DRIVER_RELOAD_REQUIRED, "rebooted: the driver is free to reload")


def _runs_targets(draft: Draft, inventory: hw.HardwareDiscovered) -> bool:
    running = {Component.GPU: inventory.driver_version, Component.OFED: inventory.ofed_version}
    saga = draft.saga
    return all(running[c] == saga.targets[c].version for c in saga.components)


on_deadline = fail_on_deadline


def effects(saga: NodeSaga, spec: GPUClusterPolicySpec) -> Effects:
    reason = f"driver unload failed in use during {saga.rollout_id}"
    reboot = reboots.reboot_node(saga, reason)
    return (issue(saga, reboot, saga.step.token),), ()
