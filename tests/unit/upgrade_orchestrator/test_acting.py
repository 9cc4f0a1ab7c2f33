"""What the outbox runs of a decision's Kubernetes actions: one node write per decision."""

from __future__ import annotations

from gpuop.events.driver import Component
from gpuop.events.upgrade import UpgradeState
from gpuop.saga import actions
from gpuop.services.upgrade_orchestrator.acting import node_writes

S = UpgradeState


def label(value: UpgradeState) -> actions.SetStateLabel:
    return actions.SetStateLabel(id=f"label-{value}", value=value)


def event(name: str) -> actions.RecordEvent:
    return actions.RecordEvent(id=name, reason="DriverUpgrade", message=name, warning=False)


def test_states_passed_through_write_only_the_last_label() -> None:
    deletion = actions.DeletePods(
        id="d", components=(Component.GPU,), force=False, timeout_seconds=1, delete_empty_dir=False
    )
    decided = (label(S.WAIT_FOR_JOBS_REQUIRED), label(S.POD_DELETION_REQUIRED), deletion)

    assert node_writes(decided) == (label(S.POD_DELETION_REQUIRED), deletion)


def test_the_cordon_writes_the_label_in_the_labels_place_before_the_event() -> None:
    decided = (label(S.CORDON_REQUIRED), event("started"), actions.Cordon(id="c"))

    assert node_writes(decided) == (
        actions.Cordon(id="c", label=S.CORDON_REQUIRED),
        event("started"),
    )


def test_the_uncordon_writes_its_states_label() -> None:
    decided = (label(S.UNCORDON_REQUIRED), actions.Uncordon(id="u"))

    assert node_writes(decided) == (actions.Uncordon(id="u", label=S.UNCORDON_REQUIRED),)


def test_a_decision_without_a_label_runs_as_decided() -> None:
    decided = (actions.Cordon(id="c"), event("started"))

    assert node_writes(decided) == decided
