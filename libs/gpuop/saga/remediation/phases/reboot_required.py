"""reboot-required: the node is rebooted (once per attempt); only a new boot id confirms it,
as for an upgrade's reboot, never time alone; its deadline fails the remediation."""

from __future__ import annotations

from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.remediation import RemediationState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import reboots
from gpuop.saga.machine import Effects, Trigger
from gpuop.saga.remediation.drafting import Draft
from gpuop.saga.remediation.phases.common import issue
from gpuop.saga.remediation.records import RemediationSaga, Step

STATE = S.REBOOT_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    draft.start(Step(name="reboot"))


def on_event(draft: Draft, trigger: Trigger) -> None:
    boot_id = reboots.new_boot(draft.saga, trigger)
    if boot_id is None:
        return
    draft.update(boot_id=boot_id, rebooted=True)
    draft.outcome_ok(f"new boot id {boot_id}")
    draft.move(S.VALIDATION_REQUIRED, "rebooted")


def on_deadline(draft: Draft, expired: DeadlineExpired) -> None:
    draft.fail("reboot not confirmed: no new boot id in time", expired=True)


def effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    reboot = reboots.reboot_node(saga, f"GPU remediation {saga.saga_id}")
    return (issue(saga, reboot),), ()
