"""The decision core of the upgrade saga: `decide(saga, event, policy, now) -> Decision`.

Pure: no I/O, no clock, no randomness. The upgrade orchestrator's runtime reads a node's
saga from KV, feeds it one event from the log (a node agent's answer, a Kubernetes
observation, a `DeadlineExpired`, or `Admitted` from the admission pass), persists the
returned saga with compare-and-set, then publishes the commands and executes the Kubernetes
actions. Replaying the same events with the same times therefore makes the same decisions
with the same ids (`gpuop replay`).

The flow (DESIGN.md section 4), one pending step at a time, each with a deadline:

    upgrade-required -(Admitted)-> cordon-required -(cordoned)-> wait-for-jobs-required
    -(no job left / no selector / deadline)-> pod-deletion-required -(deleted)->
    drain-required -(drained / disabled)-> operands-pause-required -(all paused)->
    driver-reload-required: install, unload, load per component (`gpuop.saga.steps`)
    -(loaded)-> validation-required -(validated)-> uncordon-required -(uncordoned)-> done

An unload that fails in use goes to reboot-required when the policy allows (once per
attempt); only a new boot id confirms the reboot, and the reload then runs again on the
fresh boot. Failures compensate as `gpuop.saga.compensation` says. Events that do not answer
the pending step (an old command's result, a stale deadline) change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gpuop.events import Event, ids, kube
from gpuop.events import device as dev
from gpuop.events import driver as dm
from gpuop.events import hardware as hw
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.driver import Component, UnloadFailureReason
from gpuop.events.upgrade import NodeUpgradeStateChanged, UpgradeState
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import compensation
from gpuop.saga.actions import Decision
from gpuop.saga.drafting import Draft
from gpuop.saga.records import NodeSaga, StepResult
from gpuop.saga.steps import StepKind, after, reload_plan, rollback_plan, validation_plan
from gpuop.saga.transitions import Transition

S = UpgradeState


@dataclass(frozen=True)
class Admitted:
    """The admission pass (`gpuop.saga.admission`) gave this upgrade-required node a slot."""

    canary: bool = False
    """Admitted as one of the rollout's canary nodes."""


Trigger = Event | Admitted
"""What `decide` accepts: any event from the log, or an admission."""

_SUCCESS: dict[StepKind, type[dm.DriverResult]] = {
    StepKind.INSTALL: dm.DriverInstalled,
    StepKind.UNLOAD: dm.DriverUnloaded,
    StepKind.LOAD: dm.DriverLoaded,
    StepKind.VALIDATE: dm.DriverValidated,
    StepKind.ROLLBACK: dm.DriverRolledBack,
    StepKind.ROLLBACK_VALIDATE: dm.DriverValidated,
}
_FAILURE: dict[StepKind, type[dm.DriverFailure]] = {
    StepKind.INSTALL: dm.DriverInstallFailed,
    StepKind.UNLOAD: dm.DriverUnloadFailed,
    StepKind.LOAD: dm.DriverLoadFailed,
    StepKind.VALIDATE: dm.DriverValidationFailed,
    StepKind.ROLLBACK: dm.DriverRollbackFailed,
    StepKind.ROLLBACK_VALIDATE: dm.DriverValidationFailed,
}
_BEFORE_RELOAD = frozenset(
    {
        S.UPGRADE_REQUIRED,
        S.CORDON_REQUIRED,
        S.WAIT_FOR_JOBS_REQUIRED,
        S.POD_DELETION_REQUIRED,
        S.DRAIN_REQUIRED,
        S.OPERANDS_PAUSE_REQUIRED,
    }
)


def decide(saga: NodeSaga, event: Trigger, policy: GPUClusterPolicySpec, now: datetime) -> Decision:
    """The saga after `event` at `now`, with the commands, actions and moves it causes."""
    draft = Draft(saga, policy, now)
    if isinstance(event, DeadlineExpired):
        _on_deadline(draft, event)
    elif isinstance(event, kube.NodeRemoved):
        compensation.node_removed(draft)
    elif isinstance(event, Admitted):
        if saga.state is S.UPGRADE_REQUIRED:
            draft.update(canary=event.canary)
            reason = "admitted as a canary node" if event.canary else "admitted"
            draft.move(S.CORDON_REQUIRED, reason)
    else:
        _observe(draft, event)
        _on_event(draft, event)
    return draft.decision()


def _observe(draft: Draft, event: Event) -> None:
    """Bookkeeping from observations, whatever the state: boot id, running versions, and
    whether the node was cordoned before gpuop touched it."""
    saga = draft.saga
    if saga.state is S.REBOOT_REQUIRED:
        return  # the reboot handler reads the boot id first
    if isinstance(event, kube.NodeObserved | hw.HardwareDiscovered) and event.boot_id:
        draft.update(boot_id=event.boot_id)
    first_look = saga.state is S.UPGRADE_REQUIRED and saga.attempt == 1 and not saga.cordoned
    if isinstance(event, kube.NodeObserved) and first_look:
        draft.update(initially_unschedulable=event.unschedulable)
    if isinstance(event, hw.HardwareDiscovered) and not saga.touched:
        _refresh_previous(draft, event)


def _refresh_previous(draft: Draft, inventory: hw.HardwareDiscovered) -> None:
    """While the drivers are untouched, what the node runs is the rollback target."""
    if draft.saga.state not in _BEFORE_RELOAD:
        return
    running = {Component.GPU: inventory.driver_version, Component.OFED: inventory.ofed_version}
    saga = draft.saga
    previous = dict(saga.previous_versions)
    for component in saga.components:
        version = running[component]
        if version is not None and version != saga.targets[component].version:
            previous[component] = version
    if previous != saga.previous_versions:
        draft.update(previous_versions=previous)


def _on_deadline(draft: Draft, expired: DeadlineExpired) -> None:
    saga = draft.saga
    current = (saga.saga_id, saga.state, saga.step.token, saga.attempt)
    if (expired.saga_id, expired.state, expired.step, expired.attempt) != current:
        return  # stale: the saga moved on since this deadline was set
    if saga.deadline is None:
        return
    kind = saga.step.kind
    if kind is StepKind.BACKOFF:
        draft.outcome(StepResult.SUCCEEDED, "backoff passed")
        compensation.retry(draft)
        return
    seconds = (saga.deadline - saga.step_started).total_seconds()
    detail = f"{saga.step.token} did not finish within {seconds:g} s"
    if kind is StepKind.WAIT_FOR_JOBS:
        draft.outcome(StepResult.EXPIRED, detail)
        draft.move(S.POD_DELETION_REQUIRED, f"{detail}; going on with pod deletion")
    elif kind is StepKind.POD_DELETION and draft.policy.drain.enable:
        draft.outcome(StepResult.EXPIRED, detail)
        draft.move(S.DRAIN_REQUIRED, f"{detail}; draining instead")
    else:
        if kind is StepKind.UNLOAD and saga.step.component is not None:
            draft.touch(saga.step.component)  # unanswered: the modules' state is unknown
        compensation.fail(draft, detail, StepResult.EXPIRED)


def _on_event(draft: Draft, event: Event) -> None:
    saga = draft.saga
    state, kind = saga.state, saga.step.kind
    if isinstance(event, dm.DriverResult):
        if kind in _SUCCESS and event.command_id == draft.step_id():
            _on_driver_result(draft, event)
    elif state is S.CORDON_REQUIRED:
        _on_cordon(draft, event)
    elif state is S.WAIT_FOR_JOBS_REQUIRED:
        if isinstance(event, kube.PodsObserved) and event.job_pods == 0:
            draft.outcome(StepResult.SUCCEEDED, "no selected job left")
            draft.move(S.POD_DELETION_REQUIRED, "no selected job runs on the node")
    elif state is S.POD_DELETION_REQUIRED:
        _on_pod_deletion(draft, event)
    elif state is S.DRAIN_REQUIRED:
        _on_drain(draft, event)
    elif state is S.OPERANDS_PAUSE_REQUIRED:
        _on_operand_paused(draft, event)
    elif state is S.REBOOT_REQUIRED:
        _on_reboot(draft, event)
    elif state is S.UNCORDON_REQUIRED:
        uncordoned = isinstance(event, kube.NodeUncordoned) and event.action_id in (
            None,
            draft.step_id(),
        )
        if uncordoned or (isinstance(event, kube.NodeObserved) and not event.unschedulable):
            draft.outcome(StepResult.SUCCEEDED, "node schedulable")
            draft.finish("node uncordoned")


def _on_cordon(draft: Draft, event: Event) -> None:
    saga = draft.saga
    if isinstance(event, kube.NodeCordoned) and event.action_id in (None, draft.step_id()):
        if event.was_unschedulable and saga.attempt == 1 and event.action_id is not None:
            draft.update(initially_unschedulable=True)
    elif not (isinstance(event, kube.NodeObserved) and event.unschedulable):
        return
    draft.outcome(StepResult.SUCCEEDED, "node unschedulable")
    draft.move(S.WAIT_FOR_JOBS_REQUIRED, "node cordoned")


def _on_pod_deletion(draft: Draft, event: Event) -> None:
    if not isinstance(event, kube.PodsDeleted | kube.PodDeletionFailed):
        return
    if event.action_id != draft.step_id():
        return
    if isinstance(event, kube.PodsDeleted):
        draft.outcome(StepResult.SUCCEEDED, f"{event.deleted} GPU pods deleted")
        draft.move(S.DRAIN_REQUIRED, "GPU pods deleted")
        return
    detail = f"GPU pods stayed ({event.reason}): {event.message}".rstrip(": ")
    if draft.policy.drain.enable:
        draft.outcome(StepResult.FAILED, detail)
        draft.move(S.DRAIN_REQUIRED, f"{detail}; draining instead")
    else:
        compensation.fail(draft, detail, StepResult.FAILED)


def _on_drain(draft: Draft, event: Event) -> None:
    if not isinstance(event, kube.DrainCompleted | kube.DrainFailed):
        return
    if event.action_id != draft.step_id():
        return
    if isinstance(event, kube.DrainCompleted):
        draft.outcome(StepResult.SUCCEEDED, f"{event.evicted} pods evicted")
        draft.move(S.OPERANDS_PAUSE_REQUIRED, "node drained")
        return
    blocking = f", blocked by {event.blocking_pdb}" if event.blocking_pdb else ""
    detail = f"drain failed ({event.reason}{blocking}): {event.message}".rstrip(": ")
    compensation.fail(draft, detail, StepResult.FAILED)


def _on_operand_paused(draft: Draft, event: Event) -> None:
    saga = draft.saga
    if not isinstance(event, dev.OperandPaused) or event.command_id != draft.step_id():
        return
    if event.service not in saga.operands or event.service in saga.paused:
        return
    paused = tuple(s for s in saga.operands if s in {*saga.paused, event.service})
    draft.update(paused=paused)
    if len(paused) == len(saga.operands):
        draft.outcome(StepResult.SUCCEEDED, "every operand paused")
        draft.move(S.DRIVER_RELOAD_REQUIRED, "operands released the devices")


def _on_reboot(draft: Draft, event: Event) -> None:
    saga = draft.saga
    if not isinstance(event, kube.NodeObserved | hw.HardwareDiscovered) or not event.boot_id:
        return
    if event.boot_id == saga.boot_id_at_reboot:
        return  # the boot the reboot was decided in: not rebooted yet, whatever the time
    draft.update(boot_id=event.boot_id, reload_round=saga.reload_round + 1)
    draft.outcome(StepResult.SUCCEEDED, f"new boot id {event.boot_id}")
    if isinstance(event, hw.HardwareDiscovered) and _runs_targets(draft, event):
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


def _on_driver_result(draft: Draft, result: dm.DriverResult) -> None:
    saga = draft.saga
    step = saga.step
    if isinstance(result, _FAILURE[step.kind]):
        _on_driver_failure(draft, result)
        return
    if not isinstance(result, _SUCCESS[step.kind]):
        return
    draft.outcome(StepResult.SUCCEEDED, f"{type(result).__name__} {result.component}")
    if step.kind is StepKind.UNLOAD:
        draft.touch(result.component)
    if step.kind is StepKind.ROLLBACK:
        draft.update(rolled_back=(*saga.rolled_back, result.component))
    _next_step(draft)


def _next_step(draft: Draft) -> None:
    saga = draft.saga
    state = saga.state
    if state is S.DRIVER_RELOAD_REQUIRED:
        plan = reload_plan(saga.components, draft.installable(), saga.reload_round)
        following = after(plan, saga.step)
        if following is None:
            draft.move(S.VALIDATION_REQUIRED, "new drivers loaded")
        else:
            draft.start(following)
    elif state is S.ROLLBACK_REQUIRED:
        following = after(rollback_plan(draft.rollback_components()), saga.step)
        if following is None:
            draft.move(S.VALIDATION_REQUIRED, "previous drivers restored")
        else:
            draft.start(following)
    elif state is S.VALIDATION_REQUIRED:
        rollback = saga.failure is not None
        components = saga.rolled_back if rollback else saga.components
        following = after(validation_plan(components, rollback), saga.step)
        if following is not None:
            draft.start(following)
        elif rollback:
            unrestored = tuple(c for c in saga.touched if c not in saga.rolled_back)
            draft.update(touched=unrestored)
            if unrestored:
                names = ", ".join(unrestored)
                compensation.give_up(draft, f"no previous version of {names} to restore")
            else:
                draft.move(S.UNCORDON_REQUIRED, "previous drivers validated")
        else:
            draft.update(touched=())
            draft.move(S.UNCORDON_REQUIRED, "new drivers validated")


def _on_driver_failure(draft: Draft, failure: dm.DriverFailure) -> None:
    saga = draft.saga
    detail = f"{type(failure).__name__} {failure.component}: {failure.message}".rstrip(": ")
    policy = draft.policy
    if (
        isinstance(failure, dm.DriverUnloadFailed)
        and failure.reason is UnloadFailureReason.IN_USE
        and policy.reboot_on_unload_failure
        and saga.reboots == 0
        and saga.boot_id is not None
    ):
        draft.outcome(StepResult.FAILED, detail)
        draft.update(
            boot_id_at_reboot=saga.boot_id, reboots=saga.reboots + 1, touched=saga.components
        )
        draft.move(S.REBOOT_REQUIRED, f"{detail}; rebooting to release the driver")
        return
    compensation.fail(draft, detail, StepResult.FAILED)


def deadline_event(saga: NodeSaga) -> DeadlineExpired | None:
    """The `DeadlineExpired` the runtime publishes when the saga's deadline passes; None when
    the pending step has no deadline. Schedule it for `saga.deadline`."""
    if saga.deadline is None:
        return None
    return DeadlineExpired(
        saga_id=saga.saga_id,
        state=saga.state,
        step=saga.step.token,
        attempt=saga.attempt,
        deadline=saga.deadline,
    )


def state_changed(saga: NodeSaga, transition: Transition) -> NodeUpgradeStateChanged:
    """The public event for one of a decision's transitions (`decision.saga` is `saga`)."""
    return NodeUpgradeStateChanged(
        rollout_id=saga.rollout_id,
        from_state=transition.from_state,
        to_state=transition.to_state,
        reason=transition.reason[:2048],
        attempt=transition.attempt,
        components=saga.components,
        target_versions={c: t.version for c, t in saga.targets.items()},
        previous_versions=dict(saga.previous_versions),
    )


def transition_event_id(saga: NodeSaga, sequence: int) -> str:
    """Id of the `NodeUpgradeStateChanged` of the saga's `sequence`-th transition."""
    return ids.transition(saga.saga_id, sequence)
