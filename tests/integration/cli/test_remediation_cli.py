"""`gpuop remediation release` and the executor's replacement label, against the simulated
API server: the hand-over's label is set and removed; the verb sets `done` on a node held
for replacement and refuses (exit 1) a node that is not held, or does not exist."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuop.kube import client, nodes
from gpuop.kube.recording import EventRecorder
from gpuop.saga.remediation.actions import REPLACEMENT_LABEL, MarkReplacement
from gpuop.services.upgrade_orchestrator.executing import KubeExecutor
from gpuop_sim import ApiServer
from tests.integration.cli.test_upgrade_cli import Cluster, node


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with ApiServer() as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        server.seed(node("gpu-node-1", {"nvidia.com/gpu.present": "true"}))
        async with await client.connect(kubeconfig) as kube:
            yield Cluster(server, kube, kubeconfig)


async def label(cluster: Cluster) -> str | None:
    return nodes.labels_of(await nodes.get(cluster.kube, "gpu-node-1")).get(REPLACEMENT_LABEL)


async def test_the_hand_over_label_is_set_then_released_then_removed(cluster: Cluster) -> None:
    executor = KubeExecutor(cluster.kube, EventRecorder(cluster.kube))
    refused = await cluster.cli("remediation", "release", "gpu-node-1")
    assert refused[0] == 1 and "not held for hardware replacement" in refused[2]

    await executor.execute("gpu-node-1", MarkReplacement(id="a-1", value="required"))
    assert await label(cluster) == "required"
    code, out, _ = await cluster.cli("remediation", "release", "gpu-node-1", "--json")
    assert code == 0 and '"value": "done"' in out
    assert await label(cluster) == "done"
    again = await cluster.cli("remediation", "release", "gpu-node-1")
    assert again[0] == 1 and f"{REPLACEMENT_LABEL}=done" in again[2]

    await executor.execute("gpu-node-1", MarkReplacement(id="a-2", value=None))
    assert await label(cluster) is None


async def test_a_node_that_does_not_exist_is_a_clear_failure(cluster: Cluster) -> None:
    code, _, err = await cluster.cli("remediation", "release", "gpu-node-9")
    assert code == 1 and "gpu-node-9 not found" in err
