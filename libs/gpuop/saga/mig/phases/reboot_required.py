"""reboot-required: the apply answered `mode-pending`: NVML took the GPUs' new MIG mode but
leaves it pending until the GPU is reset, and on some GPUs (A100 in passthrough, some
hypervisors) only a reboot does that. The node reboots (`RebootNode` to the driver-manager,
under the boot id the reboot was decided in, as the upgrade's and the remediation's), and
only a new boot id confirms it, never time alone; then apply-required again, with its own
step (`apply-after-reboot`) so its command is a new one. Once per reconfiguration: a mode
still pending after the reboot fails the request. No new boot id by the deadline
(`mig.deadlines.reboot`) fails it, restoring the layout recorded at the start.
"""

from __future__ import annotations

from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import reboots
from gpuop.saga.machine import Effects, StepResult, Trigger
from gpuop.saga.mig.drafting import Draft, issue
from gpuop.saga.mig.phases.common import fail_on_deadline, start
from gpuop.saga.mig.records import MigSaga, MigStepKind
from gpuop.saga.mig.states import MigState as S

STATE = S.REBOOT_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    start(draft, MigStepKind.REBOOT)


def on_event(draft: Draft, trigger: Trigger) -> None:
    boot_id = reboots.new_boot(draft.saga, trigger)
    if boot_id is None:
        return
    draft.update(boot_id=boot_id, rebooted=True)
    draft.outcome(StepResult.SUCCEEDED, f"new boot id {boot_id}")
    draft.move(S.APPLY_REQUIRED, "rebooted: the pending MIG mode is in force")


on_deadline = fail_on_deadline


def effects(saga: MigSaga, spec: GPUClusterPolicySpec) -> Effects:
    reboot = reboots.reboot_node(saga, f"MIG config {saga.config}: MIG mode pending")
    return (issue(saga, reboot, saga.step.token),), ()
