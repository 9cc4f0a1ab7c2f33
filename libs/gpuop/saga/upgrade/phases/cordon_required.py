"""cordon-required: the node is to be unschedulable; seeing it so moves on. A new node
brought up (`NodeSaga.bring_up`) passes through: the taint it carries since its saga
started keeps pods off it, and it has no GPU pods to move.

Before the cordon, while the node's pods still run, each component the saga installs from
a source is staged (`steps.stage_plan`: `StageDriver`, one at a time): the driver-manager
fetches the package, verifies it and checks that the node's kernel takes its modules. A
package that cannot be installed (a version the source lacks, a bad checksum, modules for
another kernel, unsigned modules under lockdown) fails the step here, and with nothing to
undo the saga goes straight to upgrade-failed: the node is never cordoned, its pods never
touched. The install in driver-reload-required then takes the staged copy. The state label
reads `cordon-required` while the stage runs: the state names the action still pending.
"""

from __future__ import annotations

from gpuop.events import kube
from gpuop.events.upgrade import UpgradeState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.actions import Cordon
from gpuop.saga.machine import Effects, StepResult, Trigger
from gpuop.saga.upgrade.drafting import Draft
from gpuop.saga.upgrade.effects import action_id, driver_effects
from gpuop.saga.upgrade.phases.common import BROUGHT_UP, fail_on_deadline, on_driver_result
from gpuop.saga.upgrade.records import NodeSaga
from gpuop.saga.upgrade.steps import Step, StepKind, after, stage_plan

STATE = S.CORDON_REQUIRED


def _plan(draft: Draft) -> tuple[Step, ...]:
    return stage_plan(draft.saga.components, draft.installable())


def enter(draft: Draft, retry: bool) -> None:
    plan = _plan(draft)
    if plan:
        draft.start(plan[0])
    else:
        _cordon(draft)


def _staged(draft: Draft) -> None:
    following = after(_plan(draft), draft.saga.step)
    if following is None:
        _cordon(draft)
    else:
        draft.start(following)


def _cordon(draft: Draft) -> None:
    if draft.saga.bring_up:
        step = Step(kind=StepKind.CORDON)
        draft.skip(step, S.WAIT_FOR_JOBS_REQUIRED, StepResult.SKIPPED, BROUGHT_UP)
        return
    draft.update(cordoned=True)
    draft.start(Step(kind=StepKind.CORDON))


def on_event(draft: Draft, trigger: Trigger) -> None:
    saga = draft.saga
    if saga.step.kind is StepKind.STAGE:
        # a node seen unschedulable meanwhile is not a reason to skip the stage
        on_driver_result(draft, trigger, _staged)
        return
    if isinstance(trigger, kube.NodeCordoned) and trigger.action_id in (None, draft.step_id()):
        if trigger.was_unschedulable and saga.attempt == 1 and trigger.action_id is not None:
            draft.update(initially_unschedulable=True)
    elif not (isinstance(trigger, kube.NodeObserved) and trigger.unschedulable):
        return
    draft.outcome(StepResult.SUCCEEDED, "node unschedulable")
    draft.move(S.WAIT_FOR_JOBS_REQUIRED, "node cordoned")


on_deadline = fail_on_deadline


def effects(saga: NodeSaga, spec: GPUClusterPolicySpec) -> Effects:
    if saga.step.kind is StepKind.STAGE:
        return driver_effects(saga, spec)
    return (), (Cordon(id=action_id(saga, saga.step.token)),)
