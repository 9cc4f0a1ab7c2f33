"""reboot-required: the node is rebooted (once per attempt); only a new boot id confirms it,
as for an upgrade's reboot, never time alone; its deadline fails the remediation."""

from __future__ import annotations

from gpuop.events import driver as dm
from gpuop.events import hardware as hw
from gpuop.events import kube
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.remediation import RemediationState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.machine import Effects, Trigger
from gpuop.saga.remediation.drafting import Draft
from gpuop.saga.remediation.phases.common import issue
from gpuop.saga.remediation.records import RemediationSaga, Step

STATE = S.REBOOT_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    draft.start(Step(name="reboot"))


def on_event(draft: Draft, trigger: Trigger) -> None:
    saga = draft.saga
    if not isinstance(trigger, kube.NodeObserved | hw.HardwareDiscovered) or not trigger.boot_id:
        return
    if trigger.boot_id == saga.boot_id_at_reboot:
        return  # the boot the reboot was decided in: not rebooted yet, whatever the time
    draft.update(boot_id=trigger.boot_id, rebooted=True)
    draft.outcome_ok(f"new boot id {trigger.boot_id}")
    draft.move(S.VALIDATION_REQUIRED, "rebooted")


def on_deadline(draft: Draft, expired: DeadlineExpired) -> None:
    draft.fail("reboot not confirmed: no new boot id in time", expired=True)


def effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    if saga.boot_id_at_reboot is None:
        raise ValueError("a reboot needs the boot id it was decided in")
    reboot = dm.RebootNode(boot_id=saga.boot_id_at_reboot, reason=f"GPU remediation {saga.saga_id}")
    return (issue(saga, reboot),), ()
