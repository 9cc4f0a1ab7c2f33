"""The simulated scheduler's DRA path (`gpuop_sim.cluster.claims`): a pod naming a claim
goes to a node whose ResourceSlices can give it, the claim (made from its template, owned
by the pod) allocated from that node's devices and reserved for the pod; a device another
claim holds or a DeviceTaintRule taints is never given; a claim no node can satisfy leaves
the pod Unschedulable; and the claim-based validation pod: the device-API switch's, the
upgrade's pod rung on a node serving DRA, a device quarantine's for exactly the GPU it reset
(through its taint), and one whose claim is never allocated failing at its deadline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuop.events import kube as observed
from gpuop.events.device_api_commands import DeviceApi, DeviceApiApplied
from gpuop.kube import client as kubeclient
from gpuop.kube import conditions
from gpuop.kube import dra as kube_dra
from gpuop.kube.recording import EventRecorder
from gpuop.saga import actions
from gpuop.services.upgrade_orchestrator.executing import KubeExecutor
from gpuop_sim import SimCluster
from gpuop_sim.apiserver import dra_kinds, kinds
from tests.integration.sim.clusters import running_cluster

Obj = dict[str, Any]
DRIVER = "gpu.nvidia.com"


@pytest.fixture
async def cluster() -> AsyncIterator[SimCluster]:
    async with running_cluster(nodes=2, gpus=2) as running:
        yield running


def slice_of(node: str, *devices: tuple[str, str]) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": name, "attributes": {"type": {"string": kind}}} for name, kind in devices
            ],
        },
    }


def template(count: int = 1, selectors: list[Obj] | None = None) -> Obj:
    exactly: Obj = {"deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": count}
    if selectors:
        exactly["selectors"] = selectors
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"gpus-{count}", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def claiming_pod(name: str, template_name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name}],
            "containers": [
                {"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }


async def scheduled(cluster: SimCluster, name: str) -> Obj:
    for _ in range(200):
        pod = cluster.registry.store.get(kinds.PODS.group_resource, "default", name)
        assert pod is not None
        conditions = (pod.get("status") or {}).get("conditions") or []
        if pod["spec"].get("nodeName") or any(
            c.get("reason") == "Unschedulable" for c in conditions
        ):
            return pod
        await asyncio.sleep(0.02)
    raise AssertionError(f"{name} never scheduled nor refused")


def allocation(cluster: SimCluster, claim: str) -> list[tuple[str, str]]:
    found = cluster.registry.store.get(kinds.RESOURCECLAIMS.group_resource, "default", claim)
    assert found is not None
    results = found["status"]["allocation"]["devices"]["results"]
    return [(r["pool"], r["device"]) for r in results]


async def test_a_claim_is_allocated_from_the_nodes_slice_and_never_twice(cluster: SimCluster):
    node = cluster.node_names[0]
    registry = cluster.registry
    devices = (("gpu-0", "gpu"), ("gpu-1", "gpu"), ("gpu-1-mig-1g18gb-19-0", "mig"))
    registry.create(dra_kinds.RESOURCESLICES, "", slice_of(node, *devices))
    registry.create(dra_kinds.RESOURCECLAIMTEMPLATES, "default", template())
    registry.create(kinds.PODS, "default", claiming_pod("a", "gpus-1"))
    pod = await scheduled(cluster, "a")
    assert pod["spec"]["nodeName"] == node
    assert pod["status"]["resourceClaimStatuses"] == [{"name": "gpu", "resourceClaimName": "a-gpu"}]
    assert allocation(cluster, "a-gpu") == [(node, "gpu-0")]
    claim = registry.store.get(kinds.RESOURCECLAIMS.group_resource, "default", "a-gpu")
    assert claim is not None and claim["status"]["reservedFor"][0]["name"] == "a"
    assert claim["metadata"]["ownerReferences"][0]["name"] == "a"

    # gpu-1 tainted: the next claim has no whole GPU left on any node
    selector = {"driver": DRIVER, "pool": node, "device": "gpu-1"}
    taint = {"key": "gpuop.io/gpu-unhealthy", "effect": "NoSchedule"}
    rule = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": "quarantine"},
            "spec": {"deviceSelector": selector, "taint": taint}}  # fmt: skip
    registry.create(dra_kinds.DEVICETAINTRULES, "", rule)
    registry.create(kinds.PODS, "default", claiming_pod("b", "gpus-1"))
    refused = await scheduled(cluster, "b")
    assert not refused["spec"].get("nodeName")
    [condition] = [c for c in refused["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert "cannot allocate all claims" in condition["message"]

    # untainted: the waiting pod gets gpu-1 at the next pass (a pod created wakes it), the
    # new one nothing (both GPUs held)
    registry.delete(dra_kinds.DEVICETAINTRULES, "", "quarantine")
    registry.create(kinds.PODS, "default", claiming_pod("c", "gpus-1"))
    assert not (await scheduled(cluster, "c"))["spec"].get("nodeName")
    assert (await scheduled(cluster, "b"))["spec"]["nodeName"] == node
    assert allocation(cluster, "b-gpu") == [(node, "gpu-1")]


async def test_a_selector_the_simulation_cannot_read_allocates_nothing(cluster: SimCluster):
    node = cluster.node_names[0]
    registry = cluster.registry
    registry.create(dra_kinds.RESOURCESLICES, "", slice_of(node, ("gpu-0", "gpu")))
    cel = [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'X'"}}]
    registry.create(dra_kinds.RESOURCECLAIMTEMPLATES, "default", template(1, cel))
    registry.create(kinds.PODS, "default", claiming_pod("a", "gpus-1"))
    refused = await scheduled(cluster, "a")
    assert not refused["spec"].get("nodeName")


async def test_the_switchs_claim_based_validation_pod_succeeds_on_a_dra_node(
    cluster: SimCluster, tmp_path: Path
):
    node = cluster.node_names[1]
    cluster.registry.create(dra_kinds.RESOURCESLICES, "", slice_of(node, ("gpu-0", "gpu")))
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    async with await kubeclient.connect(kubeconfig) as kube:
        executor = KubeExecutor(kube, EventRecorder(kube))
        await executor.execute(node, actions.Cordon(id="cordon"))
        run = actions.RunValidationPod(
            id="validate", image="nvcr.io/nvidia/cuda:12.2.2-base-ubuntu22.04",
            command=("nvidia-smi", "-L"), namespace="default", runtime_class_name="",
            timeout_seconds=20, device_class=DRIVER,
        )  # fmt: skip
        outcome = await executor.execute(node, run)
    assert isinstance(outcome, observed.ValidationPodSucceeded), outcome
    claims = cluster.registry.store.view(kinds.RESOURCECLAIMS.group_resource, "default")
    assert claims == [], "the claim is deleted with the pod"


def gpu_slice(node: str, uuids: dict[str, str]) -> Obj:
    """The node's slice with whole GPUs named by `uuids` (device name -> UUID)."""
    found = slice_of(node, *((name, "gpu") for name in uuids))
    for device in found["spec"]["devices"]:
        device["attributes"]["uuid"] = {"string": uuids[device["name"]]}
    return found


def rung(timeout: int = 20, device_class: str = "", gpus: tuple[str, ...] = ()) -> Any:
    return actions.RunValidationPod(
        id="validate", image="nvcr.io/nvidia/cuda:12.2.2-base-ubuntu22.04",
        command=("nvidia-smi", "-L"), namespace="default", runtime_class_name="",
        timeout_seconds=timeout, device_class=device_class, gpu_uuids=gpus,
    )  # fmt: skip


async def serving(api: DeviceApi) -> DeviceApiApplied:
    return DeviceApiApplied(api=api, serving=True)


async def validate(cluster: SimCluster, tmp_path: Path, node: str, run: Any, api: DeviceApi) -> Any:
    """The rung's outcome on the cordoned `node`, whose device plugin last said it serves
    `api`."""
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    async with await kubeclient.connect(kubeconfig) as kube:
        executor = KubeExecutor(kube, EventRecorder(kube), served=lambda _: serving(api))
        await executor.execute(node, actions.Cordon(id="cordon"))
        return await executor.execute(node, run)


async def test_the_upgrades_pod_rung_holds_a_claim_on_a_node_serving_dra(
    cluster: SimCluster, tmp_path: Path
):
    node = cluster.node_names[1]
    cluster.registry.create(dra_kinds.RESOURCESLICES, "", slice_of(node, ("gpu-0", "gpu")))
    outcome = await validate(cluster, tmp_path, node, rung(), DeviceApi.DRA)
    assert isinstance(outcome, observed.ValidationPodSucceeded), outcome
    claims = cluster.registry.store.view(kinds.RESOURCECLAIMS.group_resource, "default")
    assert claims == [], "the claim is deleted with the pod"


async def test_a_claim_never_allocated_fails_the_rung_at_its_deadline_saying_so(
    cluster: SimCluster, tmp_path: Path
):
    # the node serves DRA but publishes no slice: an nvidia.com/gpu pod would run here
    node = cluster.node_names[1]
    outcome = await validate(cluster, tmp_path, node, rung(timeout=2), DeviceApi.DRA)
    assert isinstance(outcome, observed.ValidationPodFailed), outcome
    assert outcome.reason is observed.ValidationPodFailureReason.TIMEOUT
    assert "was never allocated" in outcome.message
    assert f"{DRIVER} device in the slices of {node}" in outcome.message
    claims = cluster.registry.store.view(kinds.RESOURCECLAIMS.group_resource, "default")
    assert claims == [], "the claim is deleted at the deadline too"

    served_by_the_device_plugin = await validate(
        cluster, tmp_path, node, rung(), DeviceApi.DEVICE_PLUGIN
    )
    assert isinstance(served_by_the_device_plugin, observed.ValidationPodSucceeded)


def quarantined(cluster: SimCluster) -> str:
    """The second node, its slice's gpu-1 quarantined by a DeviceTaintRule."""
    node = cluster.node_names[1]
    cluster.registry.create(dra_kinds.RESOURCESLICES, "", gpu_slice(node, UUIDS))
    quarantine = kube_dra.taint_rule(
        driver=DRIVER, node=node, device="gpu-1", key=conditions.GPU_UNHEALTHY_TAINT
    )
    cluster.registry.create(dra_kinds.DEVICETAINTRULES, "", quarantine)
    return node


UUIDS = {"gpu-0": "GPU-00000000-0000-0000-0000-000000000000",
         "gpu-1": "GPU-11111111-1111-1111-1111-111111111111"}  # fmt: skip


async def test_a_device_quarantines_rung_claims_the_reset_gpu_through_its_taint(
    cluster: SimCluster, tmp_path: Path
):
    node = quarantined(cluster)
    run = rung(device_class=DRIVER, gpus=(UUIDS["gpu-1"],))
    outcome = await validate(cluster, tmp_path, node, run, DeviceApi.DRA)
    assert isinstance(outcome, observed.ValidationPodSucceeded), outcome


async def test_a_device_quarantines_rung_takes_no_other_gpu_than_the_reset_one(
    cluster: SimCluster, tmp_path: Path
):
    node = cluster.node_names[1]
    cluster.registry.create(dra_kinds.RESOURCESLICES, "", gpu_slice(node, UUIDS))
    registry = cluster.registry
    registry.create(dra_kinds.RESOURCECLAIMTEMPLATES, "default", template(1))
    registry.create(kinds.PODS, "default", claiming_pod("holder", "gpus-1"))
    await scheduled(cluster, "holder")
    [(_, held)] = allocation(cluster, "holder-gpu")
    free = "gpu-1" if held == "gpu-0" else "gpu-0"
    run = rung(timeout=2, device_class=DRIVER, gpus=(UUIDS[held],))
    outcome = await validate(cluster, tmp_path, node, run, DeviceApi.DRA)
    assert isinstance(outcome, observed.ValidationPodFailed), f"{free} was free: {outcome}"
    assert "was never allocated" in outcome.message


def diagnostic(timeout: int = 20) -> Any:
    """The preflight rung's pod: every device of the node's slices."""
    return actions.RunValidationPod(
        id="preflight", image="nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
        command=("dcgmi", "diag", "-r", "1"), namespace="default", runtime_class_name="",
        timeout_seconds=timeout, all_gpus=True,
    )  # fmt: skip


async def test_the_diagnostic_claims_every_gpu_of_the_slice_the_quarantined_one_included(
    cluster: SimCluster, tmp_path: Path
):
    node = quarantined(cluster)
    allocated: list[list[str]] = []

    def record(change: Any) -> None:
        status = (change.object or {}).get("status") or {}
        results = (status.get("allocation") or {}).get("devices", {}).get("results") or []
        if change.resource == kinds.RESOURCECLAIMS.group_resource and results:
            allocated.append(sorted(r["device"] for r in results))

    cluster.registry.store.observe(record)
    outcome = await validate(cluster, tmp_path, node, diagnostic(), DeviceApi.DRA)
    assert isinstance(outcome, observed.ValidationPodSucceeded), outcome
    assert allocated and allocated[-1] == ["gpu-0", "gpu-1"]


async def test_the_diagnostic_gets_no_gpu_while_another_pod_holds_one_of_them(
    cluster: SimCluster, tmp_path: Path
):
    node = cluster.node_names[1]
    cluster.registry.create(dra_kinds.RESOURCESLICES, "", gpu_slice(node, UUIDS))
    cluster.registry.create(dra_kinds.RESOURCECLAIMTEMPLATES, "default", template(1))
    cluster.registry.create(kinds.PODS, "default", claiming_pod("holder", "gpus-1"))
    await scheduled(cluster, "holder")
    outcome = await validate(cluster, tmp_path, node, diagnostic(timeout=2), DeviceApi.DRA)
    assert isinstance(outcome, observed.ValidationPodFailed), outcome
    assert "was never allocated" in outcome.message


async def test_a_failing_diagnostic_on_a_dra_node_fails_with_its_last_log_lines(
    cluster: SimCluster, tmp_path: Path
):
    node = cluster.node_names[1]
    cluster.registry.create(dra_kinds.RESOURCESLICES, "", gpu_slice(node, UUIDS))
    cluster.fail_diagnostics(node, 1, "gpu_burn: GPU 0: FAULTY")
    outcome = await validate(cluster, tmp_path, node, diagnostic(), DeviceApi.DRA)
    assert isinstance(outcome, observed.ValidationPodFailed), outcome
    assert outcome.message == "Failed: validator exited 1 (Error): gpu_burn: GPU 0: FAULTY"
