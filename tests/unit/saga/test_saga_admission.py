"""Admission: upstream's arithmetic, gpuop's differences, the canary, and the nodes left out
(skip labels, `cordonedNodes: skip`)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuop.events.driver import Component
from gpuop.policy import ComponentSpec
from gpuop.saga import admission
from gpuop.saga.admission import NodeStatus
from gpuop.saga.upgrade import records
from gpuop.saga.upgrade.steps import Step, StepKind
from tests.support.sagas import GPU_NEW, T0, S, policy, saga_for


def cluster(count: int) -> dict[str, NodeStatus]:
    return {f"node-{i:02d}": NodeStatus() for i in range(count)}


def sagas(nodes: dict[str, NodeStatus], spec, **states: Any) -> list[records.NodeSaga]:
    """A saga per node in upgrade-required; `states` overrides some (node=state or a dict)."""
    made = []
    for name in nodes:
        saga = saga_for(spec, node=name)
        override = states.get(name.replace("-", "_"))
        if isinstance(override, dict):
            saga = saga.model_copy(update=override)
        elif override is not None:
            saga = saga.model_copy(update={"state": override, "cordoned": True})
        made.append(saga)
    return made


def test_ten_nodes_with_the_defaults_go_one_at_a_time():
    spec = policy()  # maxParallelUpgrades 1, maxUnavailable 25%
    nodes = cluster(10)
    result = admission.plan(sagas(nodes, spec), nodes, spec, T0)
    assert result.max_unavailable == 3  # ceil(2.5)
    assert result.nodes == ("node-00",)
    busy = sagas(nodes, spec, node_00=S.DRAIN_REQUIRED)
    assert admission.admit(busy, nodes, spec, T0) == []


def test_sixteen_nodes_four_parallel_quarter_unavailable_admit_four():
    spec = policy(max_parallel_upgrades=4, max_unavailable="25%")
    nodes = cluster(16)
    result = admission.plan(sagas(nodes, spec), nodes, spec, T0)
    assert (result.max_unavailable, result.slots) == (4, 4)
    assert result.nodes == ("node-00", "node-01", "node-02", "node-03")
    two_busy = sagas(nodes, spec, node_00=S.DRIVER_RELOAD_REQUIRED, node_01=S.CORDON_REQUIRED)
    assert admission.admit(two_busy, nodes, spec, T0) == ["node-02", "node-03"]


@pytest.mark.parametrize(
    ("not_ready", "cordoned", "admitted"),
    [
        (0, 0, 4),
        (1, 0, 3),  # one NotReady node takes one of the four unavailable places
        (0, 2, 2),  # nodes cordoned by hand count too
        (2, 2, 0),
    ],
)
def test_notready_and_cordoned_nodes_reduce_the_slots(not_ready, cordoned, admitted):
    spec = policy(max_parallel_upgrades=4, max_unavailable="25%")
    nodes = cluster(16)
    # the unavailable nodes are upgraded already, so they are not candidates themselves
    down = sorted(nodes)[16 - not_ready - cordoned :]
    for index, name in enumerate(down):
        nodes[name] = (
            NodeStatus(ready=False) if index < not_ready else NodeStatus(unschedulable=True)
        )
    done = {name.replace("-", "_"): {"state": S.UPGRADE_DONE} for name in down}
    result = admission.plan(sagas(nodes, spec, **done), nodes, spec, T0)
    assert result.unavailable == not_ready + cordoned
    assert len(result.nodes) == admitted


def test_failed_nodes_hold_no_slot_unless_configured():
    spec = policy(max_parallel_upgrades=1, max_unavailable=5)
    nodes = cluster(10)
    failed = {"node_00": {"state": S.UPGRADE_FAILED, "cordoned": False}}
    assert admission.admit(sagas(nodes, spec, **failed), nodes, spec, T0) == ["node-01"]
    holding = policy(max_parallel_upgrades=1, max_unavailable=5, failed_nodes_hold_slot=True)
    assert admission.admit(sagas(nodes, holding, **failed), nodes, holding, T0) == []


def test_a_failed_node_left_cordoned_still_counts_as_unavailable():
    spec = policy(max_parallel_upgrades=0, max_unavailable=2)
    nodes = cluster(10)
    failed = {"node_00": {"state": S.UPGRADE_FAILED, "cordoned": True}}
    result = admission.plan(sagas(nodes, spec, **failed), nodes, spec, T0)
    assert result.unavailable == 1 and result.nodes == ("node-01",)


def test_max_parallel_zero_means_only_max_unavailable_limits():
    spec = policy(max_parallel_upgrades=0, max_unavailable="50%")
    nodes = cluster(8)
    assert len(admission.admit(sagas(nodes, spec), nodes, spec, T0)) == 4


def test_already_cordoned_nodes_are_admitted_without_a_slot_and_first():
    spec = policy()
    nodes = cluster(10)
    nodes["node-07"] = NodeStatus(unschedulable=True)
    busy = sagas(nodes, spec, node_00=S.DRAIN_REQUIRED)
    assert admission.admit(busy, nodes, spec, T0) == ["node-07"]
    idle = sagas(nodes, spec)
    assert admission.admit(idle, nodes, spec, T0) == ["node-07"]


def test_notready_and_removed_nodes_are_not_admitted():
    spec = policy(max_parallel_upgrades=0, max_unavailable="100%")
    nodes = {"a": NodeStatus(ready=False), "b": NodeStatus(exists=False), "c": NodeStatus()}
    result = admission.plan(sagas(nodes, spec), nodes, spec, T0)
    assert result.nodes == ("c",) and result.total == 2


def test_canary_nodes_go_first_and_alone():
    spec = policy(max_parallel_upgrades=4, max_unavailable="50%", canary={"nodes": 2})
    nodes = cluster(8)
    first = admission.plan(sagas(nodes, spec), nodes, spec, T0)
    assert first.nodes == first.canary == ("node-00", "node-01") and first.held_by_canary
    running = {
        "node_00": {"state": S.VALIDATION_REQUIRED, "canary": True, "cordoned": True},
        "node_01": {"state": S.UPGRADE_DONE, "canary": True},
    }
    assert admission.admit(sagas(nodes, spec, **running), nodes, spec, T0) == []
    done = {
        "node_00": {"state": S.UPGRADE_DONE, "canary": True},
        "node_01": {"state": S.UPGRADE_DONE, "canary": True},
    }
    after = admission.plan(sagas(nodes, spec, **done), nodes, spec, T0)
    assert after.nodes == ("node-02", "node-03", "node-04", "node-05")
    assert after.canary == () and not after.held_by_canary


def test_a_failed_canary_stops_admission_and_is_reported():
    spec = policy(max_parallel_upgrades=4, max_unavailable="50%", canary={"nodes": 2})
    nodes = cluster(8)
    failed = {
        "node_00": {"state": S.UPGRADE_FAILED, "canary": True},
        "node_01": {"state": S.UPGRADE_DONE, "canary": True},
    }
    result = admission.plan(sagas(nodes, spec, **failed), nodes, spec, T0)
    assert result.nodes == () and result.canary_failed == ("node-00",)


def test_a_canary_retried_after_failure_is_admitted_again_as_a_canary():
    spec = policy(max_parallel_upgrades=4, max_unavailable="50%", canary={"nodes": 1})
    nodes = cluster(4)
    retried = {"node_02": {"canary": True, "attempt": 2, "step": Step(kind=StepKind.ADMISSION)}}
    result = admission.plan(sagas(nodes, spec, **retried), nodes, spec, T0)
    assert result.nodes == result.canary == ("node-02",)


def test_a_paused_policy_admits_nothing_and_lets_admitted_nodes_go_on():
    spec = policy(max_parallel_upgrades=2, max_unavailable="50%", paused=True)
    nodes = cluster(6)
    nodes["node-05"] = NodeStatus(unschedulable=True)  # even one cordoned already waits
    busy = sagas(nodes, spec, node_00=S.DRAIN_REQUIRED)
    result = admission.plan(busy, nodes, spec, T0)
    assert result.paused and result.nodes == ()
    assert (result.in_progress, result.slots) == (1, 1)  # the figures are still computed
    resumed = policy(max_parallel_upgrades=2, max_unavailable="50%")
    assert admission.admit(busy, nodes, resumed, T0) == ["node-05"]


def test_a_saga_of_a_superseded_rollout_is_not_admitted():
    old = policy(max_parallel_upgrades=0, max_unavailable="100%")
    nodes = cluster(3)
    stale = sagas(nodes, old)
    newer = old.model_copy(
        update={"driver": old.driver.model_copy(update={"gpu": ComponentSpec(version="590.1")})}
    )
    assert admission.admit(stale, nodes, newer, T0) == []
    moved_source = old.model_copy(
        update={
            "driver": old.driver.model_copy(
                update={"gpu": ComponentSpec(version=GPU_NEW, source="https://mirror.example")}
            )
        }
    )
    assert admission.admit(stale, nodes, moved_source, T0) == ["node-00", "node-01", "node-02"]


GPU, OFED = Component.GPU, Component.OFED


def test_the_skip_labels_are_upstreams_and_only_true_counts():
    assert admission.SKIP_LABELS == {
        GPU: "nvidia.com/gpu-driver-upgrade.skip",
        OFED: "nvidia.com/ofed-driver-upgrade.skip",
    }
    labels = {
        "nvidia.com/gpu-driver-upgrade.skip": "true",
        "nvidia.com/ofed-driver-upgrade.skip": "false",
    }
    assert admission.skipped_by(labels) == {GPU}
    assert admission.skipped_by({}) == frozenset()


def test_a_node_skipped_for_every_component_is_never_admitted_and_reported():
    spec = policy(max_parallel_upgrades=0, max_unavailable="100%")
    nodes = cluster(3)
    nodes["node-01"] = NodeStatus(skip=frozenset({GPU}))
    nodes["node-02"] = NodeStatus(skip=frozenset({OFED}))  # the policy leaves OFED alone
    result = admission.plan(sagas(nodes, spec), nodes, spec, T0)
    assert result.nodes == ("node-00", "node-02")
    assert result.skipped == {"node-01": "skipped: nvidia.com/gpu-driver-upgrade.skip=true"}
    assert result.components == {}  # node-02's window is its whole saga


def test_a_skipped_node_is_not_admitted_even_when_cordoned_or_as_a_canary():
    spec = policy(max_parallel_upgrades=1, max_unavailable="100%", canary={"nodes": 1})
    nodes = cluster(3)
    nodes["node-00"] = NodeStatus(unschedulable=True, skip=frozenset({GPU}))
    result = admission.plan(sagas(nodes, spec), nodes, spec, T0)
    assert result.nodes == result.canary == ("node-01",)
    assert list(result.skipped) == ["node-00"]
    assert result.unavailable == 1  # still cordoned: it counts against maxUnavailable


def test_a_node_skipped_for_one_component_is_admitted_for_the_other():
    spec = policy(ofed=True, max_parallel_upgrades=0, max_unavailable="100%")
    nodes = cluster(3)
    nodes["node-00"] = NodeStatus(skip=frozenset({OFED}))
    nodes["node-01"] = NodeStatus(skip=frozenset({GPU, OFED}))
    touched = {"node_02": {"attempt": 2, "touched": (OFED,)}}  # a retry after an unload
    nodes["node-02"] = NodeStatus(skip=frozenset({OFED}))
    result = admission.plan(sagas(nodes, spec, **touched), nodes, spec, T0)
    assert result.nodes == ("node-00", "node-02")
    assert result.components == {"node-00": (GPU,)}  # node-02 must finish its OFED driver
    assert list(result.skipped) == ["node-01"]


def test_cordoned_nodes_skip_is_a_policy_choice():
    first = policy(max_parallel_upgrades=1, max_unavailable="100%")
    skipping = policy(max_parallel_upgrades=1, max_unavailable="100%", cordoned_nodes="skip")
    nodes = cluster(3)
    nodes["node-02"] = NodeStatus(unschedulable=True)  # cordoned by an administrator
    assert first.upgrade_policy.cordoned_nodes == "upgradeFirst"
    assert admission.admit(sagas(nodes, first, node_00=S.DRAIN_REQUIRED), nodes, first, T0) == [
        "node-02"
    ]  # upgradeFirst: beyond the slot the busy node holds
    result = admission.plan(sagas(nodes, skipping), nodes, skipping, T0)
    assert result.nodes == ("node-00",)
    assert result.skipped == {"node-02": "skipped: cordoned by someone else (cordonedNodes: skip)"}
    busy = sagas(nodes, skipping, node_00=S.DRAIN_REQUIRED)
    assert admission.admit(busy, nodes, skipping, T0) == []


def test_cordoned_nodes_skip_spares_a_node_its_own_saga_left_cordoned():
    spec = policy(max_parallel_upgrades=1, max_unavailable="100%", cordoned_nodes="skip")
    nodes = cluster(2)
    nodes["node-01"] = NodeStatus(unschedulable=True)
    retried = {"node_01": {"attempt": 2, "cordoned": True}}  # cordoned by gpuop, then failed
    result = admission.plan(sagas(nodes, spec, **retried), nodes, spec, T0)
    assert result.nodes == ("node-01",) and result.skipped == {}
