"""The simulated cluster as a client sees it: nodes, generated workloads, budgets, and the
controllers that keep them, all read through the official client."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes.aio import client

from gpuop_sim import ApiServer, SimCluster
from gpuop_sim.cluster import workloads
from tests.integration.sim.clusters import (
    controller_kind,
    gpu_deployment,
    official_client,
    ready_status,
    running_cluster,
)
from tests.support.waiting import eventually

SERVING = "ml-serving"


@pytest.fixture
async def cluster() -> AsyncIterator[SimCluster]:
    async with running_cluster(3, 8) as running:
        yield running


@pytest.fixture
def server(cluster: SimCluster) -> ApiServer:
    """The cluster's API server, for the suite's kubeconfig and client fixtures."""
    return cluster.server


async def test_nodes_report_gpu_capacity_labels_node_info_and_a_ready_heartbeat(
    core: client.CoreV1Api,
) -> None:
    nodes = (await core.list_node()).items

    assert [n.metadata.name for n in nodes] == ["gpu-node-1", "gpu-node-2", "gpu-node-3"]
    boot_ids = set()
    for node in nodes:
        labels = node.metadata.labels
        assert labels["kubernetes.io/hostname"] == node.metadata.name
        assert labels["kubernetes.io/os"] == "linux"
        assert labels["node.kubernetes.io/instance-type"] == "p5e.48xlarge"
        assert node.status.capacity["nvidia.com/gpu"] == "8"
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        info = node.status.node_info
        assert info.kernel_version and info.os_image.startswith("Ubuntu")
        assert info.kubelet_version.startswith("v1.") and info.container_runtime_version
        assert len(info.machine_id) == 32
        uuid.UUID(info.boot_id)
        boot_ids.add(info.boot_id)
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        assert (ready.status, ready.reason) == ("True", "KubeletReady")
        assert ready.last_heartbeat_time is not None
        assert node.spec.unschedulable is None and not node.spec.taints
    assert len(boot_ids) == 3


async def test_heartbeats_renew_the_node_lease(api: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api)
    first = await leases.read_namespaced_lease("gpu-node-1", "kube-node-lease")

    async def renewed() -> bool:
        lease = await leases.read_namespaced_lease("gpu-node-1", "kube-node-lease")
        return bool(lease.spec.renew_time > first.spec.renew_time)

    await eventually(renewed, timeout=3)
    assert first.spec.holder_identity == "gpu-node-1"
    assert first.metadata.owner_references[0].kind == "Node"


async def test_generated_workload_pods_all_run_with_their_controllers(
    api: client.ApiClient, core: client.CoreV1Api
) -> None:
    pods = (await core.list_pod_for_all_namespaces()).items
    by_controller: dict[str | None, list[client.V1Pod]] = {}
    for pod in pods:
        by_controller.setdefault(controller_kind(pod), []).append(pod)
        assert pod.status.phase == "Running"
        assert pod.status.pod_ip and pod.status.host_ip and pod.status.start_time
        assert all(s.ready and s.state.running for s in pod.status.container_statuses)
        assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "True"

    assert set(by_controller) == {"ReplicaSet", "Job", "DaemonSet"}
    daemon_nodes = sorted(p.spec.node_name for p in by_controller["DaemonSet"])
    assert daemon_nodes == sorted(["gpu-node-1", "gpu-node-2", "gpu-node-3"] * 2)
    scratch = {
        p.metadata.labels["app"]
        for p in pods
        if any(v.empty_dir is not None for v in p.spec.volumes or [])
    }
    assert scratch == {"embeddings", "finetune"}
    deployments = (await client.AppsV1Api(api).list_deployment_for_all_namespaces()).items
    assert {d.metadata.name: d.status.available_replicas for d in deployments} == {
        "llm-inference": 3,
        "embeddings": 2,
        "metrics-gateway": 2,
    }
    daemonsets = (await client.AppsV1Api(api).list_daemon_set_for_all_namespaces()).items
    assert [(d.status.desired_number_scheduled, d.status.number_ready) for d in daemonsets] == [
        (3, 3),
        (3, 3),
    ]
    job = await client.BatchV1Api(api).read_namespaced_job("finetune", "ml-training")
    assert (job.spec.parallelism, job.status.active) == (1, 1)


async def test_budgets_allow_the_disruptions_their_healthy_pods_leave(
    api: client.ApiClient, core: client.CoreV1Api
) -> None:
    budgets = (await client.PolicyV1Api(api).list_namespaced_pod_disruption_budget(SERVING)).items

    assert {b.metadata.name for b in budgets} == {"llm-inference", "embeddings"}
    for budget in budgets:
        selector = ",".join(f"{k}={v}" for k, v in budget.spec.selector.match_labels.items())
        pods = (await core.list_namespaced_pod(SERVING, label_selector=selector)).items
        status = budget.status
        assert status.expected_pods == len(pods)
        assert status.current_healthy == len(pods)
        assert status.disruptions_allowed == status.current_healthy - status.desired_healthy == 1


def test_a_one_node_cluster_gets_no_budget_a_drain_could_never_meet() -> None:
    alone = workloads.plan(1, 8)
    assert alone and all(w.budget is None for w in alone)
    assert {w.name: w.budget for w in workloads.plan(2, 8)} == {
        "llm-inference": ("maxUnavailable", 1),
        "embeddings": ("minAvailable", "50%"),
    }


async def test_deleting_a_deployment_pod_gets_a_replacement_and_the_budget_recovers(
    cluster: SimCluster, api: client.ApiClient, core: client.CoreV1Api
) -> None:
    # the replacement starts seconds later, so the budget is read while it is down even on a
    # busy machine (with the suite's 20 ms start it was once read back up already)
    for kubelet in cluster.kubelets.values():
        kubelet.timings = dataclasses.replace(kubelet.timings, start_delay=2.0)
    policy = client.PolicyV1Api(api)
    pods = (await core.list_namespaced_pod(SERVING, label_selector="app=llm-inference")).items
    victim = pods[0].metadata.name

    await core.delete_namespaced_pod(victim, SERVING)
    during = await policy.read_namespaced_pod_disruption_budget("llm-inference", SERVING)

    async def recovered() -> list[client.V1Pod] | None:
        current = await core.list_namespaced_pod(SERVING, label_selector="app=llm-inference")
        running = [p for p in current.items if p.status.phase == "Running"]
        names = {p.metadata.name for p in current.items}
        return running if len(running) == 3 and victim not in names else None

    replaced = await eventually(recovered)
    after = await policy.read_namespaced_pod_disruption_budget("llm-inference", SERVING)
    assert during.status.disruptions_allowed == 0
    assert (after.status.current_healthy, after.status.disruptions_allowed) == (3, 1)
    assert {p.metadata.owner_references[0].name for p in replaced} == {
        pods[0].metadata.owner_references[0].name
    }


async def test_deleting_a_deployment_removes_its_replicaset_and_pods(
    cluster: SimCluster, api: client.ApiClient, core: client.CoreV1Api
) -> None:
    apps = client.AppsV1Api(api)
    await apps.delete_namespaced_deployment("embeddings", SERVING)

    async def gone() -> bool:
        pods = await core.list_namespaced_pod(SERVING, label_selector="app=embeddings")
        sets = await apps.list_namespaced_replica_set(SERVING, label_selector="app=embeddings")
        return not pods.items and not sets.items

    await eventually(gone)
    await cluster.settle()


async def test_scaling_a_deployment_adds_pods_on_nodes_with_room(
    cluster: SimCluster, api: client.ApiClient, core: client.CoreV1Api
) -> None:
    apps = client.AppsV1Api(api)
    await apps.create_namespaced_deployment("default", gpu_deployment("batch", 1, 2))
    await apps.patch_namespaced_deployment("batch", "default", {"spec": {"replicas": 4}})

    async def scaled() -> client.V1Deployment | None:
        deployment = await apps.read_namespaced_deployment("batch", "default")
        return deployment if deployment.status.available_replicas == 4 else None

    deployment = await eventually(scaled)
    pods = (await core.list_namespaced_pod("default", label_selector="app=batch")).items
    assert deployment.status.observed_generation == 2
    assert len({p.spec.node_name for p in pods}) == 3
    assert all(cluster.gpus_in_use(name) <= 8 for name in cluster.node_names)


async def test_job_pods_complete_after_their_run_time_and_the_job_completes(
    tmp_path: Path,
) -> None:
    async with (
        running_cluster(3, 8, job_seconds=0.1) as cluster,
        official_client(cluster.write_kubeconfig(tmp_path / "kubeconfig")) as api,
    ):
        batch = client.BatchV1Api(api)

        async def complete() -> client.V1Job | None:
            job = await batch.read_namespaced_job("finetune", "ml-training")
            conditions = {c.type: c.status for c in job.status.conditions or []}
            return job if conditions.get("Complete") == "True" else None

        job = await eventually(complete)
        pods = await client.CoreV1Api(api).list_namespaced_pod("ml-training")

    assert job.status.succeeded == job.spec.completions == 1
    assert job.status.completion_time is not None
    assert [p.status.phase for p in pods.items] == ["Succeeded"]
    terminated = pods.items[0].status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (0, "Completed")


async def test_a_cluster_without_workloads_has_only_its_nodes(tmp_path: Path) -> None:
    async with (
        running_cluster(2, 4, workloads=False) as bare,
        official_client(bare.write_kubeconfig(tmp_path / "kubeconfig")) as api,
    ):
        core = client.CoreV1Api(api)
        nodes = (await core.list_node()).items
        pods = (await core.list_pod_for_all_namespaces()).items

    assert [ready_status(n) for n in nodes] == ["True", "True"]
    assert [n.status.capacity["nvidia.com/gpu"] for n in nodes] == ["4", "4"]
    assert "nvidia.com/gpu.present" not in nodes[0].metadata.labels
    assert pods == []
