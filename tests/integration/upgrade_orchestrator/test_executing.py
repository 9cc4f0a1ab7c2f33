"""The orchestrator's Kubernetes actions on the simulated cluster, through the official
client: each reports its outcome with the action's id, and a repeat reports the same."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuop.events import kube as observed
from gpuop.kube import client, nodes, pods
from gpuop.kube.recording import EventRecorder
from gpuop.saga import actions
from gpuop.services.upgrade_orchestrator.executing import KubeExecutor
from gpuop.sim import SimCluster


@pytest.fixture
async def cluster() -> AsyncIterator[SimCluster]:
    async with SimCluster(nodes=2, gpus=2, workloads=True, seed=3) as running:
        await running.settle()
        yield running


@pytest.fixture
async def kube(cluster: SimCluster, tmp_path: Path) -> AsyncIterator[client.Kube]:
    async with await client.connect(cluster.write_kubeconfig(tmp_path / "kubeconfig")) as api:
        yield api


async def test_a_repeated_cordon_reports_the_node_as_it_was_before_the_first(
    cluster: SimCluster, kube: client.Kube
) -> None:
    first, second = cluster.node_names
    executor = KubeExecutor(kube, EventRecorder(kube))
    await kube.call(kube.core.patch_node, second, {"spec": {"unschedulable": True}})

    outcomes = [
        await executor.execute(node, actions.Cordon(id=f"cordon-{node}"))
        for node in (first, first, second, second)
    ]

    assert [o.was_unschedulable for o in outcomes if isinstance(o, observed.NodeCordoned)] == [
        False,
        False,
        True,
        True,
    ]
    assert [o.action_id for o in outcomes if isinstance(o, observed.KubeActionResult)] == [
        f"cordon-{first}",
        f"cordon-{first}",
        f"cordon-{second}",
        f"cordon-{second}",
    ]
    uncordoned = await executor.execute(first, actions.Uncordon(id="uncordon"))
    assert isinstance(uncordoned, observed.NodeUncordoned)
    assert not nodes.is_unschedulable(await nodes.get(kube, first))


async def test_deleting_gpu_pods_then_draining_empties_the_node(
    cluster: SimCluster, kube: client.Kube
) -> None:
    node = cluster.node_names[0]
    executor = KubeExecutor(kube, EventRecorder(kube))
    await executor.execute(node, actions.Cordon(id="cordon"))
    assert await pods.gpu_pods_on(kube, node), "the seeded cluster runs GPU pods on the node"

    deleted = await executor.execute(
        node, actions.DeletePods(id="delete", force=True, timeout_seconds=30, delete_empty_dir=True)
    )
    drained = await executor.execute(
        node,
        actions.Drain(
            id="drain", force=True, pod_selector="", timeout_seconds=30, delete_empty_dir=True
        ),
    )

    assert isinstance(deleted, observed.PodsDeleted) and deleted.deleted > 0, deleted
    assert isinstance(drained, observed.DrainCompleted), drained
    assert await pods.gpu_pods_on(kube, node) == []
