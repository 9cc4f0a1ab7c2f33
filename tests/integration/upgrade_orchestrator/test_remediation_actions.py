"""The remediation's Kubernetes actions on the simulated API server through the official
client: the quarantine marks the node (condition `GPUHealthy` False naming the GPU and its
XID, the taint `gpuop.io/gpu-unhealthy:NoSchedule`), the release clears both and reports
`NodeUntainted` once it did, each as often as it is repeated; a failure keeps the taint and
says why; the eviction takes exactly the named pods, the node's other GPU pods stay."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuop.events import kube as observed
from gpuop.events.fields import NamespacedName
from gpuop.kube import client, conditions, nodes, pods
from gpuop.kube.recording import EventRecorder
from gpuop.saga.remediation.actions import EvictPods, MirrorHealth
from gpuop.services.upgrade_orchestrator.executing import KubeExecutor
from gpuop_sim import SimCluster

GPU = "GPU-20bce083-dbf9-2d4f-3c35-c858915accc5"


@pytest.fixture
async def cluster() -> AsyncIterator[SimCluster]:
    async with SimCluster(nodes=1, gpus=8, workloads=True, seed=5) as running:
        await running.settle()
        yield running


@pytest.fixture
async def kube(cluster: SimCluster, tmp_path: Path) -> AsyncIterator[client.Kube]:
    async with await client.connect(cluster.write_kubeconfig(tmp_path / "kubeconfig")) as api:
        yield api


async def marks(kube: client.Kube, node: str) -> tuple[str | None, str, bool]:
    """The node's GPUHealthy status and message, and whether it carries the taint."""
    found = await nodes.get(kube, node)
    condition = conditions.condition_of(found, conditions.GPU_HEALTHY_CONDITION) or {}
    tainted = any(
        t.get("key") == conditions.GPU_UNHEALTHY_TAINT and t.get("effect") == "NoSchedule"
        for t in nodes.taints_of(found)
    )
    return condition.get("status"), str(condition.get("message", "")), tainted


async def test_quarantine_and_release_mark_and_clear_the_node(
    cluster: SimCluster, kube: client.Kube
) -> None:
    (node,) = cluster.node_names
    executor = KubeExecutor(kube, EventRecorder(kube))
    quarantine = MirrorHealth(id="q-1", unhealthy=((GPU, (79,)),), taint=True)

    for _ in range(2):
        assert await executor.execute(node, quarantine) is None
    status, message, tainted = await marks(kube, node)
    assert status == "False" and GPU in message and "79" in message and tainted
    taints = [t for t in nodes.taints_of(await nodes.get(kube, node))]
    assert sum(t.get("key") == conditions.GPU_UNHEALTHY_TAINT for t in taints) == 1

    for _ in range(2):  # the release's outcome says the API server took both writes
        outcome = await executor.execute(node, MirrorHealth(id="r-1", unhealthy=(), taint=False))
        assert outcome == observed.NodeUntainted(action_id="r-1")
        status, _, tainted = await marks(kube, node)
        assert status == "True" and not tainted


async def test_a_failure_keeps_the_taint_and_says_why(
    cluster: SimCluster, kube: client.Kube
) -> None:
    (node,) = cluster.node_names
    executor = KubeExecutor(kube, EventRecorder(kube))
    await executor.execute(node, MirrorHealth(id="q-1", unhealthy=((GPU, (79,)),), taint=True))
    failed = MirrorHealth(
        id="f-1", unhealthy=((GPU, (79,)),), taint=True,
        detail="remediation failed: reboot not confirmed",
    )  # fmt: skip
    assert await executor.execute(node, failed) is None  # only the release has an outcome
    status, message, tainted = await marks(kube, node)
    assert status == "False" and tainted and "reboot not confirmed" in message


async def test_the_eviction_takes_exactly_the_named_pods(
    cluster: SimCluster, kube: client.Kube
) -> None:
    (node,) = cluster.node_names
    before = await pods.gpu_pods_on(kube, node)
    assert len(before) >= 2, "the simulated workloads put several GPU pods on the node"
    victim = before[0]["metadata"]
    named = NamespacedName(namespace=victim["namespace"], name=victim["name"])
    executor = KubeExecutor(kube, EventRecorder(kube))

    evict = EvictPods(id="e-1", pods=(named,), force=False, timeout_seconds=30,
                      delete_empty_dir=True)  # fmt: skip
    outcome = await executor.execute(node, evict)

    assert outcome == observed.PodsDeleted(action_id="e-1", deleted=1)
    left = {
        (p["metadata"]["namespace"], p["metadata"]["name"]) for p in await pods.on_node(kube, node)
    }
    assert (named.namespace, named.name) not in left
    others = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in before[1:]}
    assert others <= left
