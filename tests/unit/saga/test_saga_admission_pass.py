"""The admission pass that goes over the sagas once and looks at no uncordoned node once no
slot is left decides exactly as the plain pass (`admission_before`), whatever the fleet:
skip labels, other sagas' holds, cordons, `cordonedNodes: skip`, waves, canaries, pools,
paused pools, failed nodes that hold their slot."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuop.events.driver import Component
from gpuop.policy import validate_spec
from gpuop.policy.specs import GPUClusterPolicySpec
from gpuop.saga import admission, tallies
from gpuop.saga.admission import NodeStatus
from gpuop.saga.upgrade.records import NodeSaga
from tests.support.sagas import GPU_NEW, SOURCE, T0, S, saga_for
from tests.unit.saga import admission_before

NODES = [f"node-{i:02d}" for i in range(14)]
POOLS = (None, "train", "infer")
STATES = (
    S.UPGRADE_REQUIRED,
    S.UPGRADE_REQUIRED,
    S.CORDON_REQUIRED,
    S.DRAIN_REQUIRED,
    S.UPGRADE_FAILED,
    S.UPGRADE_DONE,
)
ZONE = "topology.kubernetes.io/zone"

# Hundreds of examples, each a fleet or an event sequence: seconds alone, more on a busy
# machine, so more than the unit suite's per-test limit.
PROPERTY_TIMEOUT = 120


@st.composite
def policies(draw: st.DrawFn) -> GPUClusterPolicySpec:
    train: dict[str, Any] = {}
    if draw(st.booleans()):
        train["canary"] = {"nodes": draw(st.integers(0, 2))}
    if draw(st.booleans()):
        train["maxParallelUpgrades"] = draw(st.integers(0, 3))
    if draw(st.booleans()):
        train["paused"] = True
    pools = [
        {"name": "train", "nodeSelector": "pool=train", "upgradePolicy": train},
        {"name": "infer", "nodeSelector": "pool=infer"},
    ]
    upgrade: dict[str, Any] = {
        "maxParallelUpgrades": draw(st.integers(0, 5)),
        "maxUnavailable": draw(st.sampled_from(("10%", "50%", "100%", 1, 3))),
        "canary": {"nodes": draw(st.integers(0, 2))},
        "cordonedNodes": draw(st.sampled_from(("upgradeFirst", "skip"))),
        "failedNodesHoldSlot": draw(st.booleans()),
    }
    if draw(st.booleans()):
        upgrade["waves"] = {"topologyLabel": ZONE}
    if draw(st.integers(0, 9)) == 0:
        upgrade["paused"] = True
    return validate_spec(
        {"driver": {"gpu": {"version": GPU_NEW, "source": SOURCE}, "pools": pools},
         "upgradePolicy": upgrade}
    )  # fmt: skip


@st.composite
def fleets(draw: st.DrawFn) -> tuple[GPUClusterPolicySpec, list[NodeSaga], dict[str, NodeStatus]]:
    spec = draw(policies())
    made = []
    statuses = {}
    for node in NODES:
        saga = saga_for(spec, node=node, pool=draw(st.sampled_from(POOLS)))
        state = draw(st.sampled_from(STATES))
        saga = saga.model_copy(
            update={"state": state, "cordoned": draw(st.booleans()), "canary": draw(st.booleans())}
        )
        made.append(saga)
        presence = draw(st.sampled_from(("managed", "managed", "managed", "removed", "unmanaged")))
        if presence == "unmanaged":
            continue
        zone = draw(st.sampled_from(("a", "b", None)))
        statuses[node] = NodeStatus(
            ready=draw(st.integers(0, 4)) > 0,
            unschedulable=draw(st.integers(0, 3)) == 0,
            exists=presence == "managed",
            held_by=draw(st.sampled_from((None, None, None, "remediation"))),
            skip=draw(st.sampled_from((frozenset(), frozenset(), frozenset({Component.GPU})))),
            labels={ZONE: zone} if zone else {},
        )
    return spec, made, statuses


@pytest.mark.timeout(PROPERTY_TIMEOUT)
@settings(max_examples=500, deadline=None)
@given(fleets())
def test_the_single_pass_admits_as_the_plain_pass(
    fleet: tuple[GPUClusterPolicySpec, list[NodeSaga], dict[str, NodeStatus]],
) -> None:
    spec, sagas, statuses = fleet
    assert admission.plan(sagas, statuses, spec, T0) == admission_before.plan(
        sagas, statuses, spec, T0
    )


@pytest.mark.timeout(PROPERTY_TIMEOUT)
@settings(max_examples=200, deadline=None)
@given(fleets())
def test_the_single_pass_over_the_tally_admits_as_the_plain_pass(
    fleet: tuple[GPUClusterPolicySpec, list[NodeSaga], dict[str, NodeStatus]],
) -> None:
    spec, sagas, statuses = fleet
    done = tallies.DoneSagas()
    live = []
    for saga in sagas:
        if tallies.settles(saga):
            done.add(saga)
        else:
            live.append(saga)
    expected = admission_before.plan(sagas, statuses, spec, T0)
    assert admission.plan(live, statuses, spec, T0, done=done) == expected


def test_a_cordoned_node_is_admitted_first_when_no_slot_is_left() -> None:
    """The early stop in the uncordoned nodes must not cut the cordoned ones."""
    spec = validate_spec(
        {"driver": {"gpu": {"version": GPU_NEW, "source": SOURCE}},
         "upgradePolicy": {"maxParallelUpgrades": 1, "maxUnavailable": "100%"}}
    )  # fmt: skip
    busy = saga_for(spec, node="node-00").model_copy(update={"state": S.DRAIN_REQUIRED})
    waiting = saga_for(spec, node="node-01")
    cordoned = saga_for(spec, node="node-02").model_copy(update={"cordoned": True})
    statuses = {name: NodeStatus() for name in ("node-00", "node-01", "node-02")}
    planned = admission.plan([busy, waiting, cordoned], statuses, spec, T0)
    assert planned.nodes == ("node-02",)
    assert planned == admission_before.plan([busy, waiting, cordoned], statuses, spec, T0)
