"""A fault that asks for new hardware (`drain-and-replace`): the node is handed over
(cordoned, its GPU pods gone, GPUHealthy False, a warning Event, the replacement label) and
held until an admin or a repair flow releases it and discovery shows another GPU in the slot."""

from __future__ import annotations

from gpuop.events import kube
from gpuop.events.remediation import RemediationState as S
from gpuop.saga import actions as upgrade_actions
from gpuop.saga.remediation import kind
from gpuop.saga.remediation.actions import (
    REPLACEMENT_LABEL,
    EvictPods,
    MarkReplacement,
    MirrorHealth,
)
from tests.support.inventories import H200, inventory
from tests.unit.saga.test_remediation import GPU, POD, SPEC, Walk

SLOT = H200.pci_bus_id
NEW_GPU = "GPU-30bce083-dbf9-2d4f-3c35-c858915accc6"
NEW_H200 = H200.model_copy(update={"uuid": NEW_GPU})


def held() -> Walk:
    """A drain-and-replace remediation handed over and waiting for the release."""
    walk = Walk(action="drain-and-replace", slots={GPU: SLOT})
    walk.to_reset()
    assert walk.state() is S.REPLACEMENT_REQUIRED and walk.saga.step.name == "hand-over"
    walk.feed(kube.NodeCordoned(action_id=walk.step_id()))
    assert walk.saga.step.name == "replacement"
    return walk


def release(walk: Walk) -> None:
    walk.feed(kube.NodeObserved(ready=True, unschedulable=True, labels={REPLACEMENT_LABEL: "done"}))


def test_drain_and_replace_hands_the_node_over_instead_of_rebooting() -> None:
    walk = Walk(action="drain-and-replace", slots={GPU: SLOT})
    walk.to_reset()

    assert walk.state() is S.REPLACEMENT_REQUIRED
    [evicted] = [a for a in walk.actions() if isinstance(a, EvictPods)]
    assert evicted.pods == (POD,)
    hand_over = walk.decisions[-1].kube_actions
    cordon = [a for a in hand_over if isinstance(a, upgrade_actions.Cordon)]
    assert len(cordon) == 1 and cordon[0].id == walk.step_id()
    (mirror,) = [a for a in hand_over if isinstance(a, MirrorHealth)]
    assert mirror.taint is True and mirror.unhealthy == ((GPU, (79,)),)
    assert f"{GPU} at {SLOT} (XID 79): drain-and-replace" in mirror.detail
    (label,) = [a for a in hand_over if isinstance(a, MarkReplacement)]
    assert label.value == "required"
    (event,) = [a for a in hand_over if isinstance(a, upgrade_actions.RecordEvent)]
    assert event.warning and GPU in event.message and "XID 79" in event.message
    assert not any(c.__class__.__name__ == "RebootNode" for c in walk.commands())


def test_a_held_node_waits_with_no_deadline_and_is_neither_done_nor_failed() -> None:
    walk = held()

    assert walk.saga.deadline is None
    assert kind.REMEDIATION.effects(walk.saga, SPEC) == ((), ())
    walk.feed(kube.NodeObserved(ready=True, unschedulable=True, labels={REPLACEMENT_LABEL: "x"}))
    walk.feed(inventory(gpus=(NEW_H200,)))  # new hardware alone releases nothing
    assert walk.state() is S.REPLACEMENT_REQUIRED and walk.saga.step.name == "replacement"


def test_a_release_without_new_hardware_is_refused_saying_why() -> None:
    walk = held()
    walk.feed(inventory())  # the same GPU still in the slot
    release(walk)

    assert walk.state() is S.REPLACEMENT_REQUIRED and walk.saga.step.name == "replacement-1"
    assert walk.saga.history[-1].result == "failed"
    refusal = walk.decisions[-1].kube_actions
    (label,) = [a for a in refusal if isinstance(a, MarkReplacement)]
    assert label.value == "required"  # back, so the flow sees its release was not taken
    (event,) = [a for a in refusal if isinstance(a, upgrade_actions.RecordEvent)]
    assert f"{SLOT} still holds {GPU}" in event.message and event.warning


def test_a_release_before_any_inventory_or_with_the_slot_empty_is_refused() -> None:
    walk = held()
    release(walk)
    assert walk.saga.step.name == "replacement-1"
    assert "no inventory" in walk.saga.history[-1].detail
    walk.feed(inventory(gpus=()))  # the GPU fell off the bus: nothing at its address
    release(walk)
    assert walk.saga.step.name == "replacement-2"
    assert f"no GPU at {SLOT}" in walk.saga.history[-1].detail


def test_a_gpu_whose_address_no_inventory_named_cannot_be_released() -> None:
    walk = Walk(action="drain-and-replace")  # the inventory at the start did not list it
    walk.to_reset()
    walk.feed(kube.NodeCordoned(action_id=walk.step_id()))
    walk.feed(inventory(gpus=(NEW_H200,)))
    release(walk)
    assert walk.state() is S.REPLACEMENT_REQUIRED
    assert f"no inventory named the PCI address of {GPU}" in walk.saga.history[-1].detail


def test_a_release_with_another_gpu_in_the_slot_uncordons_and_validates() -> None:
    walk = held()
    walk.feed(inventory(gpus=(NEW_H200,)))
    release(walk)

    assert walk.saga.step.name == "return"
    returning = walk.decisions[-1].kube_actions
    (label,) = [a for a in returning if isinstance(a, MarkReplacement)]
    assert label.value is None
    (uncordon,) = [a for a in returning if isinstance(a, upgrade_actions.Uncordon)]
    assert walk.state() is S.REPLACEMENT_REQUIRED
    walk.feed(kube.NodeUncordoned(action_id="another-action"))
    assert walk.state() is S.REPLACEMENT_REQUIRED
    walk.feed(kube.NodeUncordoned(action_id=uncordon.id))
    assert walk.state() is S.VALIDATION_REQUIRED
    walk.validate()
    walk.release()
    assert walk.state() is S.DONE


def test_a_node_cordoned_before_the_hand_over_stays_cordoned() -> None:
    walk = Walk(action="drain-and-replace", slots={GPU: SLOT})
    walk.to_reset()
    walk.feed(kube.NodeCordoned(action_id=walk.step_id(), was_unschedulable=True))
    walk.feed(inventory(gpus=(NEW_H200,)))
    release(walk)

    assert walk.state() is S.VALIDATION_REQUIRED
    assert not any(isinstance(a, upgrade_actions.Uncordon) for a in walk.actions())


def test_a_removed_held_node_ends_it() -> None:
    walk = held()
    walk.feed(kube.NodeRemoved())
    assert walk.state() is S.FAILED and walk.saga.failure == "the node was removed"
