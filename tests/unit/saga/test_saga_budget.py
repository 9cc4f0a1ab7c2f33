"""`admission.cluster_budget` weighs the one `maxUnavailable` budget as the full admission
pass does (the other saga kinds read it without running the pass)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuop.policy import Budget, validate_spec
from gpuop.policy.specs import GPUClusterPolicySpec
from gpuop.saga import admission
from gpuop.saga.admission import NodeStatus
from gpuop.saga.upgrade.records import NodeSaga
from tests.support.sagas import GPU_NEW, SOURCE, T0, S, saga_for

# Hundreds of fleets: seconds alone, more on a busy machine.
PROPERTY_TIMEOUT = 120


@st.composite
def weighed_fleets(
    draw: st.DrawFn,
) -> tuple[GPUClusterPolicySpec, list[NodeSaga], dict[str, NodeStatus]]:
    """Fleets that vary what the budget counts: node conditions, holds, removed nodes, and
    the sagas' states and cordons."""
    spec = validate_spec(
        {
            "driver": {"gpu": {"version": GPU_NEW, "source": SOURCE}},
            "upgradePolicy": {
                "maxUnavailable": draw(st.sampled_from(("1%", "34%", "100%", 1, 4, 20))),
                "failedNodesHoldSlot": draw(st.booleans()),
            },
        }
    )
    sagas: list[NodeSaga] = []
    statuses: dict[str, NodeStatus] = {}
    for i in range(draw(st.integers(0, 12))):
        node = f"node-{i:02d}"
        if draw(st.booleans()):
            state = draw(st.sampled_from(list(S)))
            cordoned = draw(st.booleans())
            saga = saga_for(spec, node=node).model_copy(
                update={"state": state, "cordoned": cordoned}
            )
            sagas.append(saga)
        statuses[node] = NodeStatus(
            ready=draw(st.booleans()),
            unschedulable=draw(st.booleans()),
            exists=draw(st.integers(0, 5)) > 0,
            held_by=draw(st.sampled_from((None, None, "remediation"))),
        )
    return spec, sagas, statuses


@pytest.mark.timeout(PROPERTY_TIMEOUT)
@settings(max_examples=300, deadline=None)
@given(weighed_fleets())
def test_the_cluster_budget_is_the_one_the_admission_pass_weighs(
    fleet: tuple[GPUClusterPolicySpec, list[NodeSaga], dict[str, NodeStatus]],
) -> None:
    spec, sagas, statuses = fleet
    planned = admission.plan(sagas, statuses, spec, T0)

    budget = admission.cluster_budget(sagas, statuses, spec.upgrade_policy)

    assert (budget.total, budget.max_unavailable, budget.unavailable) == (
        planned.total,
        planned.max_unavailable,
        planned.unavailable,
    )


def test_not_ready_cordoned_held_and_cordoning_nodes_count_once_each() -> None:
    spec = validate_spec(
        {"driver": {"gpu": {"version": GPU_NEW, "source": SOURCE}},
         "upgradePolicy": {"maxUnavailable": "50%"}}
    )  # fmt: skip
    names = [f"node-{i}" for i in range(8)]
    statuses = {name: NodeStatus() for name in names}
    statuses["node-0"] = NodeStatus(ready=False)
    statuses["node-1"] = NodeStatus(unschedulable=True)
    statuses["node-2"] = NodeStatus(held_by="remediation")
    statuses["node-7"] = NodeStatus(exists=False)  # a removed node counts for nothing
    sagas = [
        # NotReady and cordoned by its saga: one node, counted once
        saga_for(spec, node="node-0").model_copy(update={"cordoned": True}),
        saga_for(spec, node="node-3").model_copy(update={"state": S.CORDON_REQUIRED}),
        saga_for(spec, node="node-4").model_copy(
            update={"state": S.DRAIN_REQUIRED, "cordoned": True}
        ),
        saga_for(spec, node="node-5"),  # waiting, schedulable: available
    ]

    budget = admission.cluster_budget(sagas, statuses, spec.upgrade_policy)

    assert budget == Budget(total=7, max_unavailable=4, unavailable=5, free=0)
