"""The driver-not-ready taint of a new node brought up, on the simulated API server through
the official client: put on once however often the action repeats, beside the node's other
taints (a cordon's among them), and removed alone, the removal answered with the action's
id; a node changed between the read and the write is read again, its change kept."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuop.events import kube as observed
from gpuop.events.upgrade import DRIVER_NOT_READY_TAINT
from gpuop.kube import client, nodes
from gpuop.kube.recording import EventRecorder
from gpuop.saga import actions
from gpuop.services.upgrade_orchestrator.executing import KubeExecutor
from gpuop_sim import SimCluster

OURS = {"key": DRIVER_NOT_READY_TAINT, "effect": "NoSchedule"}
THEIRS = {"key": "dedicated", "value": "training", "effect": "NoSchedule"}


@pytest.fixture
async def cluster() -> AsyncIterator[SimCluster]:
    async with SimCluster(nodes=1, gpus=2, workloads=False, seed=3) as running:
        await running.settle()
        yield running


@pytest.fixture
async def kube(cluster: SimCluster, tmp_path: Path) -> AsyncIterator[client.Kube]:
    async with await client.connect(cluster.write_kubeconfig(tmp_path / "kubeconfig")) as api:
        yield api


def without_times(taints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in t.items() if k != "timeAdded"} for t in taints]


async def taints(kube: client.Kube, node: str) -> list[dict[str, Any]]:
    return without_times(nodes.taints_of(await nodes.get(kube, node)))


async def test_the_taint_goes_on_once_beside_the_others_and_comes_off_alone(
    cluster: SimCluster, kube: client.Kube
) -> None:
    (node,) = cluster.node_names
    await kube.call(kube.core.patch_node, node, {"spec": {"taints": [THEIRS]}})
    executor = KubeExecutor(kube, EventRecorder(kube))

    assert await executor.execute(node, actions.Taint(id="taint-1")) is None
    assert await executor.execute(node, actions.Taint(id="taint-1")) is None
    assert await taints(kube, node) == [THEIRS, OURS]

    await executor.execute(node, actions.Cordon(id="cordon-1"))
    untainted = await executor.execute(node, actions.Untaint(id="untaint-1"))
    assert untainted == observed.NodeUntainted(action_id="untaint-1")
    found = await taints(kube, node)
    assert THEIRS in found and OURS not in found
    assert nodes.is_unschedulable(await nodes.get(kube, node))  # the cordon is not ours to undo

    again = await executor.execute(node, actions.Untaint(id="untaint-1"))
    assert again == observed.NodeUntainted(action_id="untaint-1")


async def test_a_taint_written_meanwhile_is_kept(cluster: SimCluster, kube: client.Kube) -> None:
    (node,) = cluster.node_names
    stale = await nodes.get(kube, node)
    await kube.call(kube.core.patch_node, node, {"spec": {"taints": [THEIRS]}})
    await nodes.taint(kube, node, DRIVER_NOT_READY_TAINT, known=stale)  # 409, read again
    assert await taints(kube, node) == [THEIRS, OURS]
    await nodes.untaint(kube, node, DRIVER_NOT_READY_TAINT, known=stale)
    assert await taints(kube, node) == [THEIRS]
