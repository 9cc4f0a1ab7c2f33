"""hardware-replacement-required: the fault asks for new hardware (`drain-and-replace`), so
the node is handed over for a repair instead of rebooted, and held there, neither done nor
failed, until it comes back with other hardware:

    hand-over     cordoned (`Cordon`, confirmed by `NodeCordoned`); with it GPUHealthy False
                  naming the GPUs, their XIDs and why, the taint, a warning Event, and the
                  label gpuop.io/hardware-replacement=required that a repair flow watches
    replacement   no deadline: waits for that label set to `done` (by the flow, or
                  `gpuop remediation release`), then checks discovery's last inventory:
                  each faulty GPU's PCI address must hold a GPU with another UUID. Else the
                  release is refused: an Event says why and the label goes back to
                  `required` (step `replacement-<n>`, n the refusals so far)
    return        the label removed and the node uncordoned (unless it was cordoned before
                  the hand-over), confirmed by `NodeUncordoned`; then validation-required,
                  whose ladder checks the new GPUs before the release

A node the admin removes instead ends the remediation (remediation-failed), as in any state.
"""

from __future__ import annotations

from gpuop.events import kube
from gpuop.events.remediation import RemediationState as S
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import actions as upgrade_actions
from gpuop.saga.machine import Effects, StepResult, Trigger, ignore
from gpuop.saga.remediation.actions import (
    EVENT_REASON,
    REPLACEMENT_DONE,
    REPLACEMENT_LABEL,
    REPLACEMENT_REQUIRED,
    MarkReplacement,
    MirrorHealth,
)
from gpuop.saga.remediation.drafting import Draft
from gpuop.saga.remediation.phases.common import action_id, answers_action, unhealthy_of
from gpuop.saga.remediation.records import RemediationSaga, Step

STATE = S.REPLACEMENT_REQUIRED
HAND_OVER = "hand-over"
WAIT = "replacement"
RETURN = "return"


def enter(draft: Draft, retry: bool) -> None:
    draft.start(Step(name=HAND_OVER))


def unchanged(saga: RemediationSaga) -> str:
    """Why the node's hardware does not count as replaced yet; empty once each faulty GPU's
    PCI address holds a GPU with another UUID in discovery's last inventory."""
    if saga.inventory is None:
        return "no inventory from discovery since the hand-over"
    reasons = []
    for gpu in saga.gpu_uuids:
        slot = saga.slots.get(gpu)
        if slot is None:
            reasons.append(f"no inventory named the PCI address of {gpu}")
        elif slot not in saga.inventory:
            reasons.append(f"no GPU at {slot} (where {gpu} was)")
        elif saga.inventory[slot] == gpu:
            reasons.append(f"{slot} still holds {gpu}")
    return "; ".join(reasons)


def _why(saga: RemediationSaga) -> str:
    gpus = ", ".join(
        f"{gpu} at {saga.slots.get(gpu, 'an unknown address')} ({_fault(saga, gpu, xids)})"
        for gpu, xids in unhealthy_of(saga)
        if gpu in saga.gpu_uuids
    )
    return f"{gpus}: {saga.action} asks for new hardware"


def _fault(saga: RemediationSaga, gpu: str, xids: tuple[int, ...]) -> str:
    """What the GPU was seen doing: its XIDs, and the signal unless it was the XID itself."""
    said = [f"XID {', '.join(map(str, xids))}"] if xids else []
    signal = saga.signals.get(gpu)
    if signal and not (xids and signal.startswith("xid")):
        said.append(f"signal {signal}")
    return ", ".join(said) or "no XID or signal named"


def _released(draft: Draft) -> None:
    saga = draft.saga
    reason = unchanged(saga)
    if reason:
        draft.outcome(StepResult.FAILED, f"release refused: {reason}")
        draft.update(release_refusals=saga.release_refusals + 1)
        draft.start(Step(name=f"{WAIT}-{saga.release_refusals + 1}"))
        return
    draft.outcome_ok("released, the hardware changed")
    draft.start(Step(name=RETURN))
    if saga.cordoned_before:
        _returned(draft, "released; the node stays cordoned as it was before")


def _returned(draft: Draft, reason: str) -> None:
    draft.outcome_ok(reason)
    draft.move(S.VALIDATION_REQUIRED, f"{reason}: the new hardware is validated")


def on_event(draft: Draft, trigger: Trigger) -> None:
    step = draft.saga.step.name
    if step == HAND_OVER and answers_action(draft, trigger):
        assert isinstance(trigger, kube.KubeActionResult)
        was = isinstance(trigger, kube.NodeCordoned) and trigger.was_unschedulable
        draft.update(cordoned_before=was)
        draft.outcome_ok("cordoned, labelled for replacement")
        draft.start(Step(name=WAIT))
    elif step.startswith(WAIT) and _release_asked(trigger):
        _released(draft)
    elif (
        step == RETURN
        and isinstance(trigger, kube.NodeUncordoned)
        and answers_action(draft, trigger)
    ):
        _returned(draft, "released and uncordoned")


def _release_asked(trigger: Trigger) -> bool:
    """An admin or a repair flow set the label to `done`."""
    return (
        isinstance(trigger, kube.NodeObserved)
        and trigger.labels.get(REPLACEMENT_LABEL) == REPLACEMENT_DONE
    )


on_deadline = ignore


def effects(saga: RemediationSaga, spec: GPUClusterPolicySpec) -> Effects:
    step = saga.step.name
    if step == HAND_OVER:
        why = _why(saga)
        return (), (
            upgrade_actions.Cordon(id=action_id(saga)),
            MirrorHealth(
                id=action_id(saga, "hand-over-health"),
                unhealthy=unhealthy_of(saga),
                taint=True if spec.remediation.quarantine else None,
                detail=f"hardware replacement required: {why}",
            ),
            MarkReplacement(id=action_id(saga, "hand-over-label"), value=REPLACEMENT_REQUIRED),
            upgrade_actions.RecordEvent(
                id=action_id(saga, "hand-over-event"),
                reason=EVENT_REASON,
                message=(
                    f"hardware replacement required: {why}; the node stays cordoned until "
                    f"{REPLACEMENT_LABEL}={REPLACEMENT_DONE} and discovery finds another GPU "
                    "there"
                )[:1024],
                warning=True,
            ),
        )
    if step.startswith(f"{WAIT}-"):
        return (), (
            MarkReplacement(id=action_id(saga, f"{step}-label"), value=REPLACEMENT_REQUIRED),
            upgrade_actions.RecordEvent(
                id=action_id(saga),
                reason=EVENT_REASON,
                message=f"release refused, the hardware has not changed: {unchanged(saga)}"[:1024],
                warning=True,
            ),
        )
    if step == RETURN:
        label = MarkReplacement(id=action_id(saga, "return-label"), value=None)
        if saga.cordoned_before:
            return (), (label,)
        return (), (label, upgrade_actions.Uncordon(id=action_id(saga)))
    return (), ()
