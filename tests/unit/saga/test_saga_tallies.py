"""The done sagas counted instead of read (`tallies.DoneSagas`): admission over the sagas in
play plus the tally decides exactly as admission over every saga."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuop.policy import validate_spec
from gpuop.policy.specs import GPUClusterPolicySpec
from gpuop.saga import admission, tallies
from gpuop.saga.admission import NodeStatus
from gpuop.saga.upgrade.records import NodeSaga
from tests.support.sagas import GPU_NEW, SOURCE, T0, S, saga_for

NODES = [f"node-{i:02d}" for i in range(12)]
POOLS = (None, "train", "infer")
STATES = (S.UPGRADE_REQUIRED, S.CORDON_REQUIRED, S.DRAIN_REQUIRED, S.UPGRADE_FAILED)

# Hundreds of examples, each a fleet or an event sequence: seconds alone, more on a busy
# machine, so more than the unit suite's per-test limit.
PROPERTY_TIMEOUT = 120


def pooled_policy(parallel: int, canary: int, train_canary: int | None) -> GPUClusterPolicySpec:
    train: dict[str, Any] = {} if train_canary is None else {"canary": {"nodes": train_canary}}
    pools = [
        {"name": "train", "nodeSelector": "pool=train", "upgradePolicy": train},
        {"name": "infer", "nodeSelector": "pool=infer"},
    ]
    return validate_spec(
        {
            "driver": {"gpu": {"version": GPU_NEW, "source": SOURCE}, "pools": pools},
            "upgradePolicy": {
                "maxParallelUpgrades": parallel,
                "maxUnavailable": "50%",
                "canary": {"nodes": canary},
            },
        }
    )


@st.composite
def fleets(draw: st.DrawFn) -> tuple[GPUClusterPolicySpec, list[NodeSaga], dict[str, NodeStatus]]:
    spec = pooled_policy(
        draw(st.integers(0, 4)), draw(st.integers(0, 2)), draw(st.none() | st.integers(0, 2))
    )
    made = []
    statuses = {}
    for node in NODES:
        pool = draw(st.sampled_from(POOLS))
        saga = saga_for(spec, node=node, pool=pool)
        done = draw(st.booleans())  # about half done, as late in a rollout
        state = S.UPGRADE_DONE if done else draw(st.sampled_from(STATES))
        saga = saga.model_copy(
            update={
                "state": state,
                "cordoned": draw(st.booleans()) if state is not S.UPGRADE_REQUIRED else False,
                "canary": draw(st.booleans()),
            }
        )
        made.append(saga)
        presence = draw(st.sampled_from(("managed", "managed", "removed", "unmanaged")))
        if presence != "unmanaged":
            statuses[node] = NodeStatus(
                ready=draw(st.booleans()),
                unschedulable=draw(st.booleans()),
                exists=presence == "managed",
            )
    return spec, made, statuses


def counted(sagas: list[NodeSaga]) -> tuple[list[NodeSaga], tallies.DoneSagas]:
    """The sagas split as the orchestrator's index splits them."""
    done = tallies.DoneSagas()
    live = []
    for saga in sagas:
        if tallies.settles(saga):
            done.add(saga)
        else:
            live.append(saga)
    return live, done


@pytest.mark.timeout(PROPERTY_TIMEOUT)
@settings(max_examples=300, deadline=None)
@given(fleets())
def test_admission_over_the_tally_is_admission_over_every_saga(
    fleet: tuple[GPUClusterPolicySpec, list[NodeSaga], dict[str, NodeStatus]],
) -> None:
    spec, sagas, statuses = fleet
    live, done = counted(sagas)
    every = admission.plan(sagas, statuses, spec, T0)
    assert admission.plan(live, statuses, spec, T0, done=done) == every


def test_a_done_canary_counts_for_its_pool_without_being_read() -> None:
    spec = pooled_policy(2, 1, None)
    first = saga_for(spec, node="node-00").model_copy(
        update={"state": S.UPGRADE_DONE, "canary": True}
    )
    waiting = saga_for(spec, node="node-01")
    statuses = {"node-00": NodeStatus(), "node-01": NodeStatus()}
    live, done = counted([first, waiting])
    assert live == [waiting]
    without = admission.plan(live, statuses, spec, T0)
    counted_in = admission.plan(live, statuses, spec, T0, done=done)
    assert without.canary == ("node-01",)  # unaware of the done canary: a second one
    assert counted_in.nodes == ("node-01",) and counted_in.canary == ()


def test_a_done_saga_still_cordoned_by_itself_is_not_counted_but_read() -> None:
    """Its cordon makes its node unavailable: admission must see it."""
    spec = pooled_policy(2, 0, None)
    cordoned = saga_for(spec, node="node-00").model_copy(
        update={"state": S.UPGRADE_DONE, "cordoned": True}
    )
    assert not tallies.settles(cordoned)


def test_a_node_in_both_the_sagas_and_the_tally_is_taken_from_the_sagas() -> None:
    spec = pooled_policy(2, 1, None)
    canary_done = saga_for(spec, node="node-00").model_copy(
        update={"state": S.UPGRADE_DONE, "canary": True}
    )
    done = tallies.DoneSagas()
    done.add(canary_done)
    again = saga_for(spec, node="node-00")  # a new rollout's saga, the tally not told yet
    statuses = {"node-00": NodeStatus()}
    planned = admission.plan([again], statuses, spec, T0, done=done)
    assert planned.canary == ("node-00",)  # the done canary of the same node is not counted


def test_moving_a_node_between_pools_or_out_of_the_tally_leaves_nothing_behind() -> None:
    spec = pooled_policy(2, 0, None)
    done = tallies.DoneSagas()
    train = saga_for(spec, node="node-00", pool="train").model_copy(
        update={"state": S.UPGRADE_DONE, "canary": True}
    )
    done.add(train)
    done.add(train.model_copy(update={"pool": "infer", "canary": False}))

    def everyone(node: str) -> bool:
        return True

    assert done.pools_where(everyone) == {"infer"}
    assert done.canaries_where("train", everyone) == 0
    done.discard("node-00")
    done.discard("node-00")  # twice, or a node never counted: nothing happens
    done.discard("node-99")
    assert len(done) == 0 and done.pools_where(everyone) == set()


def test_done_nodes_that_admission_does_not_manage_count_for_nothing() -> None:
    spec = pooled_policy(2, 1, None)
    done = tallies.DoneSagas()
    done.add(
        saga_for(spec, node="node-00", pool="train").model_copy(
            update={"state": S.UPGRADE_DONE, "canary": True}
        )
    )
    removed = {"node-00": NodeStatus(exists=False), "node-01": NodeStatus()}
    waiting = saga_for(spec, node="node-01", pool="train")
    planned = admission.plan([waiting], removed, spec, T0, done=done)
    assert planned == admission.plan([waiting], removed, spec, T0)
    assert planned.canary == ("node-01",)
