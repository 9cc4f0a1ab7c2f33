"""Simulated nodes at work: the kubelet's termination and admission, GPU accounting by the
scheduler, cordons, taints and selectors, operand gating of DaemonSets, and reboots; all
observed through the official client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from kubernetes.aio import client, watch

from gpuop_sim import ApiServer, SimCluster
from gpuop_sim.cluster import workloads
from tests.integration.sim.clusters import (
    controller_kind,
    gpu_deployment,
    gpu_pod,
    ready_status,
    running_cluster,
)
from tests.support.waiting import eventually

GPU = "nvidia.com/gpu"


@pytest.fixture
async def cluster(request: pytest.FixtureRequest) -> AsyncIterator[SimCluster]:
    options = getattr(request, "param", {})
    async with running_cluster(**options) as running:
        yield running


@pytest.fixture
def server(cluster: SimCluster) -> ApiServer:
    return cluster.server


async def pod_named(core: client.CoreV1Api, name: str) -> client.V1Pod | None:
    pods = await core.list_namespaced_pod("default", field_selector=f"metadata.name={name}")
    return pods.items[0] if pods.items else None


@pytest.mark.parametrize(
    "cluster", [{"nodes": 1, "workloads": False, "termination_cap": 5.0}], indirect=True
)
async def test_a_terminating_pod_is_gone_once_its_grace_period_ends(
    core: client.CoreV1Api,
) -> None:
    await core.create_namespaced_pod("default", gpu_pod("slow", 1, terminationGracePeriodSeconds=1))
    await eventually(lambda: _phase(core, "slow", "Running"))

    started = time.monotonic()
    await core.delete_namespaced_pod("slow", "default")
    lingering = await pod_named(core, "slow")
    await eventually(lambda: _absent(core, "slow"), timeout=3)
    elapsed = time.monotonic() - started

    assert lingering is not None and lingering.metadata.deletion_timestamp is not None
    assert lingering.metadata.deletion_grace_period_seconds == 1
    assert 0.9 <= elapsed < 2.5


@pytest.mark.parametrize("cluster", [{"nodes": 2, "workloads": False}], indirect=True)
async def test_gpu_requests_on_a_node_never_exceed_its_gpus(
    cluster: SimCluster, api: client.ApiClient, core: client.CoreV1Api
) -> None:
    apps = client.AppsV1Api(api)
    placed: dict[str, tuple[str, int]] = {}
    worst: dict[str, int] = {}

    async def observe() -> None:
        async with watch.Watch() as stream:
            async for event in stream.stream(
                core.list_namespaced_pod, "default", timeout_seconds=10
            ):
                pod = event["object"]
                holds = pod.spec.node_name and pod.status.phase not in ("Succeeded", "Failed")
                if event["type"] == "DELETED" or not holds:
                    placed.pop(pod.metadata.name, None)
                else:
                    gpus = int(pod.spec.containers[0].resources.requests[GPU])
                    placed[pod.metadata.name] = (pod.spec.node_name, gpus)
                for node in {n for n, _ in placed.values()}:
                    held = sum(g for n, g in placed.values() if n == node)
                    worst[node] = max(worst.get(node, 0), held)

    watching = asyncio.create_task(observe())
    try:
        await apps.create_namespaced_deployment("default", gpu_deployment("train", 5, 3))

        async def one_left_pending() -> client.V1Pod | None:
            pods = (await core.list_namespaced_pod("default", label_selector="app=train")).items
            pending = [p for p in pods if p.status.phase == "Pending"]
            running = [p for p in pods if p.status.phase == "Running"]
            return pending[0] if len(running) == 4 and len(pending) == 1 else None

        pending = await eventually(one_left_pending)
        await apps.patch_namespaced_deployment("train", "default", {"spec": {"replicas": 6}})
        await apps.delete_namespaced_deployment("train", "default")
        await cluster.settle()
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)

    scheduled = next(c for c in pending.status.conditions if c.type == "PodScheduled")
    assert (scheduled.status, scheduled.reason) == ("False", "Unschedulable")
    assert scheduled.message == "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    assert worst == {"gpu-node-1": 6, "gpu-node-2": 6}


@pytest.mark.parametrize("cluster", [{"nodes": 1, "workloads": False}], indirect=True)
async def test_the_kubelet_refuses_a_pod_bound_to_a_node_without_free_gpus(
    core: client.CoreV1Api,
) -> None:
    await core.create_namespaced_pod("default", gpu_pod("big", 6, nodeName="gpu-node-1"))
    await eventually(lambda: _phase(core, "big", "Running"))

    await core.create_namespaced_pod("default", gpu_pod("extra", 4, nodeName="gpu-node-1"))
    refused = await eventually(lambda: _phase(core, "extra", "Failed"))

    assert refused.status.reason == "OutOfnvidia.com/gpu"
    assert refused.status.message == (
        "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 4, "
        "used: 6, capacity: 8"
    )


@pytest.mark.parametrize("cluster", [{"nodes": 3, "workloads": False}], indirect=True)
async def test_the_scheduler_honours_cordons_taints_selectors_and_tolerations(
    core: client.CoreV1Api,
) -> None:
    await core.patch_node("gpu-node-1", {"spec": {"unschedulable": True}})
    taint = {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}
    await core.patch_node("gpu-node-2", {"spec": {"taints": [taint]}})
    await core.patch_node("gpu-node-3", {"metadata": {"labels": {"pool": "a"}}})

    await core.create_namespaced_pod("default", gpu_pod("anywhere", 1))
    await core.create_namespaced_pod("default", gpu_pod("pool-b", 1, nodeSelector={"pool": "b"}))
    tolerant = [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}]
    await core.create_namespaced_pod(
        "default", gpu_pod("infra", 1, tolerations=tolerant, nodeSelector={"pool": "x"})
    )
    anywhere = await eventually(lambda: _phase(core, "anywhere", "Running"))
    await core.patch_node("gpu-node-2", {"metadata": {"labels": {"pool": "x"}}})
    infra = await eventually(lambda: _phase(core, "infra", "Running"))

    async def refused() -> str | None:
        pod = await pod_named(core, "pool-b")
        conditions = {c.type: c for c in (pod.status.conditions if pod else None) or []}
        return conditions["PodScheduled"].message if "PodScheduled" in conditions else None

    assert anywhere.spec.node_name == "gpu-node-3"
    assert infra.spec.node_name == "gpu-node-2"
    assert await eventually(refused) == (
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint {dedicated: infra}, 1 node(s) were unschedulable."
    )


async def test_daemonset_pods_stop_and_start_with_their_operand_label(
    cluster: SimCluster, core: client.CoreV1Api
) -> None:
    label = workloads.DRIVER_DEPLOY_LABEL
    namespace = workloads.OPERATOR_NAMESPACE
    selector = f"app={workloads.DRIVER_DAEMONSET}"

    async def driver_pods(node: str) -> list[client.V1Pod]:
        pods = await core.list_namespaced_pod(
            namespace, label_selector=selector, field_selector=f"spec.nodeName={node}"
        )
        return list(pods.items)

    before = await driver_pods("gpu-node-2")
    await core.patch_node(
        "gpu-node-2", {"metadata": {"labels": {label: "paused-for-driver-upgrade"}}}
    )

    async def stopped() -> bool:
        return not await driver_pods("gpu-node-2")

    await eventually(stopped)
    await core.patch_node("gpu-node-2", {"metadata": {"labels": {label: "true"}}})

    async def restarted() -> client.V1Pod | None:
        pods = await driver_pods("gpu-node-2")
        return pods[0] if pods and pods[0].status.phase == "Running" else None

    after = await eventually(restarted)
    others = await driver_pods("gpu-node-1")
    assert len(before) == 1 and after.metadata.name != before[0].metadata.name
    assert controller_kind(after) == "DaemonSet"
    assert len(others) == 1


async def test_a_rebooted_node_goes_not_ready_then_ready_with_a_new_boot_id(
    cluster: SimCluster, core: client.CoreV1Api
) -> None:
    before = await core.read_node("gpu-node-2")
    old_boot = before.status.node_info.boot_id
    seen: list[tuple[str, str, bool]] = []

    async with watch.Watch() as stream:
        rebooting = asyncio.create_task(cluster.reboot("gpu-node-2", down_for=0.3))
        async for event in stream.stream(
            core.list_node,
            field_selector="metadata.name=gpu-node-2",
            resource_version=before.metadata.resource_version,
            timeout_seconds=10,
        ):
            node = event["object"]
            unreachable = any(
                t.key == "node.kubernetes.io/unreachable" for t in node.spec.taints or []
            )
            seen.append((ready_status(node), node.status.node_info.boot_id, unreachable))
            if seen[-1][0] == "True" and seen[-1][1] != old_boot and not unreachable:
                break
        await rebooting
    await cluster.settle()
    pods = (await core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-node-2")).items
    events = await core.list_namespaced_event(
        "default", field_selector="involvedObject.name=gpu-node-2,reason=Rebooted"
    )

    states = [(ready, boot == old_boot) for ready, boot, _ in seen]
    assert states[0] == ("Unknown", True)
    assert states[-1] == ("True", False)
    assert ("Unknown", True, True) in [(r, b == old_boot, u) for r, b, u in seen]
    new_boot = seen[-1][1]
    assert new_boot == cluster.boot_id("gpu-node-2")
    assert all(p.status.container_statuses[0].restart_count == 1 for p in pods)
    assert {controller_kind(p) for p in pods} >= {"DaemonSet"}
    assert events.items[0].message == f"Node gpu-node-2 has been rebooted, boot id: {new_boot}"


async def test_pods_of_a_powered_off_node_are_not_ready_and_budgets_count_them_out(
    cluster: SimCluster, api: client.ApiClient, core: client.CoreV1Api
) -> None:
    cluster.power_off("gpu-node-3")
    pods = await core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-node-3")
    budget = await client.PolicyV1Api(api).read_namespaced_pod_disruption_budget(
        "llm-inference", "ml-serving"
    )
    cluster.power_on("gpu-node-3")
    await cluster.settle()

    assert pods.items
    for pod in pods.items:
        assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "False"
    assert (budget.status.current_healthy, budget.status.disruptions_allowed) == (2, 0)


async def _phase(core: client.CoreV1Api, name: str, phase: str) -> client.V1Pod | None:
    pod = await pod_named(core, name)
    return pod if pod is not None and pod.status.phase == phase else None


async def _absent(core: client.CoreV1Api, name: str) -> bool:
    return await pod_named(core, name) is None


async def test_pods_deleted_on_a_powered_off_node_linger_until_it_is_back(
    cluster: SimCluster, core: client.CoreV1Api
) -> None:
    on_node = await core.list_namespaced_pod(
        "ml-serving", label_selector="app=llm-inference", field_selector="spec.nodeName=gpu-node-1"
    )
    victim = on_node.items[0].metadata.name
    cluster.power_off("gpu-node-1")
    await core.delete_namespaced_pod(victim, "ml-serving")

    with pytest.raises(RuntimeError, match="already down"):
        await cluster.reboot("gpu-node-1", down_for=0.1)
    with pytest.raises(TimeoutError, match="node gpu-node-1 is down"):
        await cluster.settle(timeout=0.2)
    lingering = await core.read_namespaced_pod(victim, "ml-serving")
    cluster.power_on("gpu-node-1")
    await cluster.settle()
    remaining = await core.list_namespaced_pod("ml-serving", label_selector="app=llm-inference")

    assert lingering.metadata.deletion_timestamp is not None
    assert victim not in {p.metadata.name for p in remaining.items}
    assert len(remaining.items) == 3
