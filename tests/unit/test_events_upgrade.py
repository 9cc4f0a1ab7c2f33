"""The upgrade states keep upstream's label values, and state events route by their state."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpuop.events import MalformedMessage, bus_subject, new_event, subjects
from gpuop.events.driver import Component
from gpuop.events.fields import member_docs
from gpuop.events.upgrade import (
    TERMINAL_STATES,
    NodeUpgradeStateChanged,
    RolloutStarted,
    RolloutTrigger,
    UpgradeState,
)
from gpuop.saga.machine import Transition, state_event

# NVIDIA/k8s-operator-libs pkg/upgrade/consts.go: the label values, as upstream spells them.
UPSTREAM_LABEL_VALUES = {
    "upgrade-required",
    "cordon-required",
    "wait-for-jobs-required",
    "pod-deletion-required",
    "drain-required",
    "node-maintenance-required",
    "post-maintenance-required",
    "pod-restart-required",
    "validation-required",
    "uncordon-required",
    "upgrade-done",
    "upgrade-failed",
}
UPSTREAM_USED = {
    "upgrade-required",
    "cordon-required",
    "wait-for-jobs-required",
    "pod-deletion-required",
    "drain-required",
    "validation-required",
    "uncordon-required",
    "upgrade-done",
    "upgrade-failed",
}
OURS = {"operands-pause-required", "driver-reload-required", "reboot-required", "rollback-required"}


def test_states_are_upstreams_label_values_plus_ours() -> None:
    assert UPSTREAM_USED <= UPSTREAM_LABEL_VALUES
    assert not OURS & UPSTREAM_LABEL_VALUES
    assert {state.value for state in UpgradeState} == UPSTREAM_USED | OURS


def test_states_are_in_the_order_of_the_saga() -> None:
    assert [state.value for state in UpgradeState] == [
        "upgrade-required",
        "cordon-required",
        "wait-for-jobs-required",
        "pod-deletion-required",
        "drain-required",
        "operands-pause-required",
        "driver-reload-required",
        "reboot-required",
        "rollback-required",
        "validation-required",
        "uncordon-required",
        "upgrade-done",
        "upgrade-failed",
    ]
    assert {UpgradeState.UPGRADE_DONE, UpgradeState.UPGRADE_FAILED} == TERMINAL_STATES


def test_every_state_says_how_a_node_enters_and_where_it_goes() -> None:
    docs = member_docs(UpgradeState)
    assert list(docs) == list(UpgradeState.__members__)
    for name, doc in docs.items():
        assert doc and "\n" not in doc, name
        assert doc.endswith("."), name
    schema = NodeUpgradeStateChanged.model_json_schema()["$defs"]["UpgradeState"]
    for state in UpgradeState:
        assert f"- `{state.value}`: {docs[state.name]}" in schema["description"]


def _changed(to_state: UpgradeState) -> NodeUpgradeStateChanged:
    return NodeUpgradeStateChanged(
        rollout_id="r1",
        from_state=None,
        to_state=to_state,
        components=(Component.GPU,),
        target_versions={Component.GPU: "580.159.04"},
    )


@pytest.mark.parametrize("state", list(UpgradeState))
def test_a_state_change_is_published_on_the_subject_of_the_new_state(state: UpgradeState) -> None:
    envelope = new_event(_changed(state), node="gpu-1.example.com", source="/gpuop/test")
    subject = bus_subject(envelope)
    assert subject == f"gpuop.evt.upgrade.gpu-1_example_com.{state.value}"
    assert subjects.parse_subject(subject).name == state.value
    assert NodeUpgradeStateChanged.subject_token_of(envelope.data) == state.value


@pytest.mark.parametrize("data", [{}, {"to_state": "bogus"}, {"to_state": 3}])
def test_state_change_data_without_a_valid_state_has_no_subject(data: dict[str, object]) -> None:
    with pytest.raises(MalformedMessage):
        NodeUpgradeStateChanged.subject_token_of(data)


def test_rollout_events_are_published_about_the_cluster() -> None:
    started = RolloutStarted(
        rollout_id="r1",
        trigger=RolloutTrigger.CLI,
        target_versions={Component.GPU: "580.159.04"},
        total=8,
        max_parallel_upgrades=1,
        max_unavailable=2,
    )
    envelope = new_event(started, node=subjects.CLUSTER, source="/gpuop/upgrade-orchestrator")
    assert bus_subject(envelope) == "gpuop.evt.upgrade._cluster.rollout-started"
    assert started.CLUSTER_WIDE


@pytest.mark.parametrize("value", [2, "25%", "100%", "0%"])
def test_max_unavailable_is_a_count_or_a_percentage(value: int | str) -> None:
    data = {
        "rollout_id": "r1",
        "trigger": "policy",
        "target_versions": {"gpu": "1.0"},
        "total": 1,
        "max_parallel_upgrades": 0,
        "max_unavailable": value,
    }
    assert RolloutStarted.model_validate(data).max_unavailable == value


@pytest.mark.parametrize("value", ["25", "101%", "-1%", -1, "all"])
def test_max_unavailable_refuses_anything_else(value: int | str) -> None:
    data = {
        "rollout_id": "r1",
        "trigger": "policy",
        "target_versions": {"gpu": "1.0"},
        "total": 1,
        "max_parallel_upgrades": 0,
        "max_unavailable": value,
    }
    with pytest.raises(ValueError):
        RolloutStarted.model_validate(data)


def test_a_moves_event_carries_its_states_and_attempt_and_cuts_a_long_reason() -> None:
    move = Transition(UpgradeState.DRAIN_REQUIRED, UpgradeState.UPGRADE_FAILED, "x" * 5000, 2)
    event = state_event(
        NodeUpgradeStateChanged,
        move,
        rollout_id="r1",
        components=(Component.GPU,),
        target_versions={},
    )
    assert (event.from_state, event.to_state, event.attempt) == (
        UpgradeState.DRAIN_REQUIRED,
        UpgradeState.UPGRADE_FAILED,
        2,
    )
    assert event.reason == "x" * 2048
    assert event.subject_token() == "upgrade-failed"


def test_a_moves_event_without_the_kinds_own_fields_is_refused() -> None:
    move = Transition(None, UpgradeState.UPGRADE_REQUIRED, "started", 1)
    with pytest.raises(ValidationError, match="rollout_id"):
        state_event(NodeUpgradeStateChanged, move, components=(Component.GPU,), target_versions={})
