"""uncordon-required: resume the operands and uncordon (never a node that was cordoned
before the upgrade); the end of every attempt that cordoned, done or compensated.

A new node brought up (`NodeSaga.bring_up`) was never cordoned: here its driver-not-ready
taint is removed once the driver validated (`Untaint`, whose `NodeUntainted` ends the
state). An attempt that failed leaves the taint on, so nothing is scheduled onto a node
without a working driver; the reason is in the saga and in the upgrade-failed Event."""

from __future__ import annotations

from gpuop.events import device as dev
from gpuop.events import kube
from gpuop.events.upgrade import DRIVER_NOT_READY_TAINT
from gpuop.events.upgrade import UpgradeState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.actions import IssuedCommand, KubeAction, Uncordon, Untaint
from gpuop.saga.machine import Effects, StepResult, Trigger
from gpuop.saga.upgrade.drafting import Draft
from gpuop.saga.upgrade.effects import RESUME_STEP, action_id, issue
from gpuop.saga.upgrade.phases.common import fail_on_deadline
from gpuop.saga.upgrade.records import NodeSaga
from gpuop.saga.upgrade.steps import Step, StepKind

STATE = S.UNCORDON_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    draft.start(Step(kind=StepKind.UNCORDON))
    if draft.saga.bring_up:
        if draft.saga.failure is not None:
            draft.outcome(StepResult.SKIPPED, f"{DRIVER_NOT_READY_TAINT} stays: no working driver")
            finish(draft, f"left tainted {DRIVER_NOT_READY_TAINT}")
        return
    if draft.saga.initially_unschedulable:
        # only the resume was issued: there is no uncordon to wait for
        draft.outcome(StepResult.SKIPPED, "node was cordoned before the upgrade")
        finish(draft, "left cordoned as it was found")


def on_event(draft: Draft, trigger: Trigger) -> None:
    if draft.saga.bring_up:
        if isinstance(trigger, kube.NodeUntainted) and trigger.action_id == draft.step_id():
            draft.outcome(StepResult.SUCCEEDED, f"{DRIVER_NOT_READY_TAINT} removed")
            finish(draft, "driver ready: taint removed")
        return
    uncordoned = isinstance(trigger, kube.NodeUncordoned) and trigger.action_id in (
        None,
        draft.step_id(),
    )
    if uncordoned or (isinstance(trigger, kube.NodeObserved) and not trigger.unschedulable):
        draft.outcome(StepResult.SUCCEEDED, "node schedulable")
        finish(draft, "node uncordoned")


def finish(draft: Draft, reason: str) -> None:
    """End the state: done, or failed when the attempt had failed."""
    draft.update(operands_paused=False, cordoned=False, paused=())
    failure = draft.saga.failure
    if failure is None:
        draft.move(S.UPGRADE_DONE, reason)
    else:
        draft.move(S.UPGRADE_FAILED, f"{failure.reason} (compensated: {reason})")


on_deadline = fail_on_deadline
"""compensation.fail ends the saga in upgrade-failed: the driver question is settled."""


def effects(saga: NodeSaga, spec: GPUClusterPolicySpec) -> Effects:
    """The resume of the operands paused (`RESUME_STEP`), and the uncordon unless the node
    was cordoned before; for a node brought up, the untaint once its driver validated."""
    commands: tuple[IssuedCommand, ...] = ()
    if saga.operands_paused:
        resume = dev.ResumeOperands(reason=f"driver upgrade of {saga.rollout_id} ended")
        commands = (issue(saga, resume, RESUME_STEP),)
    actions: tuple[KubeAction, ...] = ()
    if saga.bring_up:
        if saga.failure is None:
            actions = (Untaint(id=action_id(saga, saga.step.token)),)
    elif not saga.initially_unschedulable:
        actions = (Uncordon(id=action_id(saga, saga.step.token)),)
    return commands, actions
