"""`admission.cluster_budget` weighs the one `maxUnavailable` budget as the full admission
pass does (the other saga kinds read it without running the pass)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from gpuop.policy import Budget, validate_spec
from gpuop.policy.specs import GPUClusterPolicySpec
from gpuop.saga import admission
from gpuop.saga.admission import NodeStatus
from gpuop.saga.records import NodeSaga
from tests.support.sagas import GPU_NEW, SOURCE, T0, S, saga_for
from tests.unit.saga.test_saga_admission_pass import PROPERTY_TIMEOUT, fleets


@pytest.mark.timeout(PROPERTY_TIMEOUT)
@settings(max_examples=300, deadline=None)
@given(fleets())
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
