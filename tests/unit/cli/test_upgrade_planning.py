"""`gpuop upgrade plan`'s arithmetic: waves from the admission pass, makespan from the
durations per state, measured from past state changes or defaulted from the policy."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpuop.cli import planning
from gpuop.cli.planning import Duration, PlanNode, StateChange
from gpuop.events.driver import Component
from gpuop.events.upgrade import UpgradeState
from gpuop.saga.admission import NodeStatus
from tests.support.sagas import T0, policy

S = UpgradeState
MINUTE = {state: Duration(60 / len(planning.PATH)) for state in planning.PATH}
"""One minute per node upgrade."""


def nodes(count: int, **special: PlanNode) -> dict[str, PlanNode]:
    found = {f"n{i}": PlanNode() for i in range(1, count + 1)}
    found.update({name: node for name, node in special.items()})
    return found


def test_max_parallel_two_upgrades_five_nodes_in_three_waves() -> None:
    spec = policy(max_parallel_upgrades=2, max_unavailable="100%")
    plan = planning.forecast(nodes(5), spec, MINUTE)
    assert [(w.start, w.nodes) for w in plan.waves] == [
        (0.0, ("n1", "n2")),
        (pytest.approx(60.0), ("n3", "n4")),
        (pytest.approx(120.0), ("n5",)),
    ]
    assert plan.makespan == pytest.approx(180.0) and plan.node_seconds == pytest.approx(60.0)


def test_max_unavailable_limits_when_parallelism_is_unlimited() -> None:
    spec = policy(max_parallel_upgrades=0, max_unavailable="50%")
    plan = planning.forecast(nodes(8), spec, MINUTE)
    assert [len(w.nodes) for w in plan.waves] == [4, 4]
    assert plan.makespan == pytest.approx(120.0)


def test_nodes_under_way_hold_their_slot_for_what_they_have_left() -> None:
    spec = policy(max_parallel_upgrades=1, max_unavailable="100%")
    busy = PlanNode(NodeStatus(unschedulable=True), state=S.UNCORDON_REQUIRED)
    plan = planning.forecast(nodes(2, n1=busy), spec, MINUTE)
    left = MINUTE[S.UNCORDON_REQUIRED].seconds
    assert plan.under_way == ("n1",)
    assert [(w.start, w.nodes) for w in plan.waves] == [(pytest.approx(left), ("n2",))]
    assert plan.makespan == pytest.approx(left + 60.0)


def test_done_notready_and_canary_nodes() -> None:
    spec = policy(max_parallel_upgrades=3, max_unavailable="100%", canary={"nodes": 1})
    special = {
        "n1": PlanNode(needs_upgrade=False),
        "n2": PlanNode(NodeStatus(ready=False)),
    }
    plan = planning.forecast(nodes(6, **special), spec, MINUTE)
    assert plan.already_done == ("n1",) and plan.never_admitted == ("n2",)
    assert [(w.nodes, w.canary) for w in plan.waves] == [
        (("n3",), ("n3",)),
        (("n4", "n5", "n6"), ()),
    ]


def test_skipped_nodes_are_never_admitted_in_the_plan() -> None:
    spec = policy(max_parallel_upgrades=0, max_unavailable="100%", cordoned_nodes="skip")
    special = {
        "n1": PlanNode(NodeStatus(skip=frozenset({Component.GPU}))),
        "n2": PlanNode(NodeStatus(unschedulable=True)),
    }
    plan = planning.forecast(nodes(3, **special), spec, MINUTE)
    assert plan.never_admitted == ("n1", "n2")
    assert [w.nodes for w in plan.waves] == [("n3",)]


def test_waves_go_one_failure_domain_at_a_time_and_windows_do_not_stop_the_plan() -> None:
    zone = "topology.kubernetes.io/zone"
    spec = policy(
        max_parallel_upgrades=0,
        max_unavailable="100%",
        waves={"topology_label": zone},
        maintenance_windows=[{"start": "01:00", "end": "02:00", "days": ["Sun"]}],
    )
    special = {
        "n1": PlanNode(NodeStatus(labels={zone: "b"})),
        "n2": PlanNode(NodeStatus(labels={zone: "a"})),
        "n3": PlanNode(NodeStatus(labels={zone: "a"})),
    }
    plan = planning.forecast(nodes(3, **special), spec, MINUTE)
    assert [w.nodes for w in plan.waves] == [("n2", "n3"), ("n1",)]


def test_a_paused_policy_is_planned_as_if_resumed() -> None:
    spec = policy(max_parallel_upgrades=1, max_unavailable="100%", paused=True)
    assert len(planning.forecast(nodes(2), spec, MINUTE).waves) == 2


def test_durations_are_measured_per_state_from_consecutive_changes() -> None:
    def change(saga: str, state: UpgradeState, seconds: float) -> StateChange:
        return StateChange(saga, state, T0 + timedelta(seconds=seconds))

    measured = planning.measure(
        [
            change("a", S.CORDON_REQUIRED, 0),
            change("a", S.WAIT_FOR_JOBS_REQUIRED, 2),
            change("a", S.UPGRADE_DONE, 12),
            change("b", S.WAIT_FOR_JOBS_REQUIRED, 100),
            change("b", S.POD_DELETION_REQUIRED, 130),
            change("b", S.UPGRADE_FAILED, 140),  # the failed step's time counts too
        ]
    )
    assert measured[S.CORDON_REQUIRED] == Duration(2.0, 1)
    assert measured[S.WAIT_FOR_JOBS_REQUIRED] == Duration(20.0, 2)
    assert measured[S.POD_DELETION_REQUIRED] == Duration(10.0, 1)
    spec = policy()  # no job selector, drain disabled
    filled = planning.durations(spec, measured)
    assert filled[S.WAIT_FOR_JOBS_REQUIRED] == Duration(20.0, 2)
    assert filled[S.DRAIN_REQUIRED] == Duration(planning.SKIPPED_SECONDS)
    assert filled[S.DRIVER_RELOAD_REQUIRED] == Duration(
        planning.DEFAULT_SECONDS[S.DRIVER_RELOAD_REQUIRED]
    )
    assert planning.durations(spec)[S.WAIT_FOR_JOBS_REQUIRED].samples == 0
