"""upgrade-required: the node waits for a slot; an admission cordons it.

A new node brought up (`NodeSaga.bring_up`: no driver, no GPU pods) is admitted without a
slot, and its step puts the taint `gpuop.io/driver-not-ready:NoSchedule` on it as the saga
starts (issued again after a takeover, and on a retry: the taint is kept until a driver
validated).

An admission may narrow the components (`Admitted.components`): a node skip label
(`admission.SKIP_LABELS`, such as `nvidia.com/ofed-driver-upgrade.skip=true`) kept one of
the saga's components out when the node was admitted, so this upgrade reloads only the
others. The skipped one is left to the next rollout that finds it outdated: removing the
label later starts no second upgrade of the node in this rollout. The admission pass
decides that from the node's labels and records it in the `NodeAdmitted` event, so a replay
narrows the saga alike.
Only this state reads it: a label set once the saga is past upgrade-required changes nothing
(upstream's skip label, too, only keeps a node from starting).
"""

from __future__ import annotations

from gpuop.events.driver import Component
from gpuop.events.upgrade import UpgradeState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga.actions import Taint
from gpuop.saga.admission import SKIP_LABELS
from gpuop.saga.machine import Admitted, Effects, Trigger, ignore
from gpuop.saga.upgrade.drafting import Draft
from gpuop.saga.upgrade.effects import action_id
from gpuop.saga.upgrade.records import NodeSaga
from gpuop.saga.upgrade.steps import Step, StepKind

STATE = S.UPGRADE_REQUIRED
TAINT_STEP = "taint"
"""Token of the `Taint` of a node brought up (its id, with the saga's attempt)."""


def enter(draft: Draft, retry: bool) -> None:
    draft.start(Step(kind=StepKind.ADMISSION))


def on_event(draft: Draft, trigger: Trigger) -> None:
    if isinstance(trigger, Admitted):
        draft.update(canary=trigger.canary)
        reason = "admitted as a canary node" if trigger.canary else "admitted"
        left_out = _narrow(draft, tuple(Component(c) for c in trigger.components))
        if left_out:
            labels = ", ".join(f"{SKIP_LABELS[c]}=true" for c in left_out)
            reason = f"{reason}; {', '.join(left_out)} left out ({labels})"
        draft.move(S.CORDON_REQUIRED, reason)


def _narrow(draft: Draft, wanted: tuple[Component, ...]) -> tuple[Component, ...]:
    """Keep the saga's components that `wanted` names (all when it names none of them), and
    the touched ones in any case: a retry must finish or roll back what the failed attempt
    changed. Returns the components left out."""
    saga = draft.saga
    kept = tuple(c for c in saga.components if c in wanted or c in saga.touched)
    if not wanted or not kept or kept == saga.components:
        return ()
    draft.update(
        components=kept,
        targets={c: t for c, t in saga.targets.items() if c in kept},
        previous_versions={c: v for c, v in saga.previous_versions.items() if c in kept},
        expected_devices={c: n for c, n in saga.expected_devices.items() if c in kept},
    )
    return tuple(c for c in saga.components if c not in kept)


on_deadline = ignore
"""Admission has no deadline: a node waits for its slot as long as the rollout takes."""


def effects(saga: NodeSaga, spec: GPUClusterPolicySpec) -> Effects:
    """Only a wait, but for a node brought up: its taint."""
    if not saga.bring_up:
        return (), ()
    return (), (Taint(id=action_id(saga, TAINT_STEP)),)
