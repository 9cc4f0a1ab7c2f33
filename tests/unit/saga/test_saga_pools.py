"""Driver pools at admission: every pool rolls at once, each within its own parallelism and
canary, all within the cluster's one maxUnavailable."""

from __future__ import annotations

from typing import Any

from gpuop.policy import validate_spec
from gpuop.policy.specs import GPUClusterPolicySpec
from gpuop.saga import admission
from gpuop.saga.admission import NodeStatus
from gpuop.saga.upgrade.records import NodeSaga
from tests.support.sagas import GPU_NEW, SOURCE, T0, S, saga_for

TRAIN = [f"train-{i}" for i in range(1, 5)]
INFER = [f"infer-{i}" for i in range(1, 5)]
OTHER = ["cpu-heavy-1", "cpu-heavy-2"]
POOL_OF = {**dict.fromkeys(TRAIN, "train"), **dict.fromkeys(INFER, "infer")}


def spec(
    *, train: dict[str, Any] | None = None, infer: dict[str, Any] | None = None, **upgrade: Any
) -> GPUClusterPolicySpec:
    pools = [
        {"name": "train", "nodeSelector": "pool=train", "gpu": {"version": "570.172.08"},
         "upgradePolicy": train or {}},
        {"name": "infer", "nodeSelector": "pool=infer", "upgradePolicy": infer or {}},
    ]  # fmt: skip
    return validate_spec(
        {
            "driver": {"gpu": {"version": GPU_NEW, "source": SOURCE}, "pools": pools},
            "upgradePolicy": {"maxParallelUpgrades": 2, "maxUnavailable": "100%", **upgrade},
        }
    )


def fleet(**states: S) -> tuple[list[NodeSaga], dict[str, NodeStatus]]:
    wanted = spec()
    made = []
    for node in (*TRAIN, *INFER, *OTHER):
        saga = saga_for(wanted, node=node, pool=POOL_OF.get(node))
        state = states.get(node.replace("-", "_"))
        if state is not None:
            saga = saga.model_copy(update={"state": state, "cordoned": state is not S.UPGRADE_DONE})
        made.append(saga)
    return made, {node.node: NodeStatus() for node in made}


def by_pool(nodes: tuple[str, ...]) -> dict[str | None, list[str]]:
    grouped: dict[str | None, list[str]] = {}
    for node in nodes:
        grouped.setdefault(POOL_OF.get(node), []).append(node)
    return grouped


def test_a_saga_installs_its_pools_drivers() -> None:
    wanted = spec()
    assert saga_for(wanted, node="train-1", pool="train").targets["gpu"].version == "570.172.08"
    assert saga_for(wanted, node="infer-1", pool="infer").targets["gpu"].version == GPU_NEW
    assert saga_for(wanted, node="cpu-heavy-1").targets["gpu"].version == GPU_NEW


def test_every_pool_rolls_at_once_each_within_its_own_parallelism() -> None:
    sagas, nodes = fleet()
    wanted = spec(train={"maxParallelUpgrades": 1})
    planned = admission.plan(sagas, nodes, wanted, T0)
    assert by_pool(planned.nodes) == {
        "train": ["train-1"],
        "infer": ["infer-1", "infer-2"],
        None: ["cpu-heavy-1", "cpu-heavy-2"],
    }


def test_the_pools_share_the_clusters_max_unavailable() -> None:
    sagas, nodes = fleet(train_1=S.DRIVER_RELOAD_REQUIRED)  # one node down already
    wanted = spec(maxUnavailable=3)  # of 10 nodes: 2 more may go
    planned = admission.plan(sagas, nodes, wanted, T0)
    assert (planned.max_unavailable, planned.unavailable, planned.slots) == (3, 1, 2)
    assert len(planned.nodes) == 2
    assert planned.nodes == ("cpu-heavy-1", "cpu-heavy-2")  # in name order across the pools


def test_a_pools_canary_holds_only_that_pool() -> None:
    sagas, nodes = fleet()
    wanted = spec(infer={"canary": {"nodes": 1}})
    planned = admission.plan(sagas, nodes, wanted, T0)
    assert by_pool(planned.nodes)["infer"] == ["infer-1"]
    assert planned.canary == ("infer-1",)
    assert len(by_pool(planned.nodes)["train"]) == 2
    assert planned.held_pools == ("infer",)


def test_a_failed_canary_holds_its_pool_and_not_the_others() -> None:
    wanted = spec(infer={"canary": {"nodes": 1}})
    sagas, nodes = fleet(infer_1=S.UPGRADE_FAILED)
    sagas = [s.model_copy(update={"canary": True}) if s.node == "infer-1" else s for s in sagas]
    planned = admission.plan(sagas, nodes, wanted, T0)
    assert planned.canary_failed == ("infer-1",)
    assert "infer" not in by_pool(planned.nodes)
    assert by_pool(planned.nodes)["train"] == ["train-1", "train-2"]


def test_the_clusters_canary_counts_per_pool_when_a_pool_sets_none() -> None:
    sagas, nodes = fleet()
    planned = admission.plan(sagas, nodes, spec(canary={"nodes": 1}), T0)
    assert sorted(planned.canary) == ["cpu-heavy-1", "infer-1", "train-1"]
    assert sorted(planned.nodes) == sorted(planned.canary)


def test_a_paused_pool_admits_nothing_while_the_others_go_on() -> None:
    sagas, nodes = fleet()
    planned = admission.plan(sagas, nodes, spec(train={"paused": True}), T0)
    assert "train" not in by_pool(planned.nodes)
    assert len(by_pool(planned.nodes)["infer"]) == 2


def test_a_saga_of_a_pool_the_policy_dropped_is_never_admitted() -> None:
    sagas, nodes = fleet()
    dropped = validate_spec({"driver": {"gpu": {"version": GPU_NEW, "source": SOURCE}}})
    planned = admission.plan(sagas, nodes, dropped, T0)
    assert set(planned.nodes) == {"cpu-heavy-1"}  # the pool-less nodes, one at a time
