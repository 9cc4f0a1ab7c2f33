"""The decision core of the upgrade saga: `decide(saga, event, policy, now) -> Decision`.

`decide` runs the upgrade kind (`gpuop.saga.upgrade.kind.UPGRADE`) on the saga machinery
(`gpuop.saga.machine`): the behaviour of each state is in its phase module
(`gpuop.saga.upgrade.phases`).

Pure: no I/O, no clock, no randomness. The upgrade orchestrator's runtime reads a node's
saga from KV, feeds it one event from the log (a node agent's answer, a Kubernetes
observation, a `DeadlineExpired`, or `Admitted` from the admission pass), persists the
returned saga with compare-and-set, then publishes the commands and executes the Kubernetes
actions. Replaying the same events with the same times therefore makes the same decisions
with the same ids (`gpuop replay`).

The flow (upstream's state names), one pending step at a time, each with a deadline:

    upgrade-required -(Admitted)-> cordon-required -(cordoned)-> wait-for-jobs-required
    -(no job left / no selector / deadline)-> pod-deletion-required -(deleted)->
    drain-required -(drained / disabled)-> operands-pause-required -(all paused)->
    driver-reload-required: install, unload, load per component (`gpuop.saga.upgrade.steps`)
    -(loaded)-> validation-required -(validated)-> uncordon-required -(uncordoned)-> done

An unload that fails in use goes to reboot-required when the policy allows (once per
attempt); only a new boot id confirms the reboot, and the reload then runs again on the
fresh boot. Failures compensate as `gpuop.saga.upgrade.compensation` says. Events that do not answer
the pending step (an old command's result, a stale deadline) change nothing.
"""

from __future__ import annotations

from datetime import datetime

from gpuop.events import ids
from gpuop.events.upgrade import NodeUpgradeStateChanged
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import machine
from gpuop.saga.actions import Decision
from gpuop.saga.machine import Admitted, Trigger, deadline_event
from gpuop.saga.upgrade.drafting import Draft
from gpuop.saga.upgrade.kind import UPGRADE
from gpuop.saga.upgrade.records import NodeSaga
from gpuop.saga.upgrade.table import Transition

__all__ = [
    "Admitted",
    "Trigger",
    "deadline_event",
    "decide",
    "state_changed",
    "transition_event_id",
]


def decide(saga: NodeSaga, event: Trigger, policy: GPUClusterPolicySpec, now: datetime) -> Decision:
    """The saga after `event` at `now`, with the commands, actions and moves it causes."""
    return machine.decide(Draft(UPGRADE, saga, policy, now), event).decision()


def state_changed(saga: NodeSaga, transition: Transition) -> NodeUpgradeStateChanged:
    """The public event for one of a decision's transitions (`decision.saga` is `saga`)."""
    return machine.state_event(
        NodeUpgradeStateChanged,
        transition,
        rollout_id=saga.rollout_id,
        components=saga.components,
        target_versions={c: t.version for c, t in saga.targets.items()},
        previous_versions=dict(saga.previous_versions),
    )


def transition_event_id(saga: NodeSaga, sequence: int) -> str:
    """Id of the `NodeUpgradeStateChanged` of the saga's `sequence`-th transition."""
    return ids.transition(saga.saga_id, sequence)
