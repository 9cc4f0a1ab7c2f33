"""The validation ladder's pod on the simulated cluster, through the official client: bound
to the cordoned node, it runs and Succeeds, and is gone after; a pod the kubelet cannot
admit (its GPUs taken) is tried again until its timeout, which names the kubelet's reason,
and succeeds once the GPUs are free; one that never starts (the
node powered off) reports its timeout; a repeat after a crash waits for the same pod."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuop.events import kube as observed
from gpuop.events.driver import Component
from gpuop.kube import client, errors, pods, validationpods
from gpuop.kube.recording import EventRecorder
from gpuop.saga import actions
from gpuop.services.upgrade_orchestrator.executing import KubeExecutor
from gpuop_sim import SimCluster
from tests.support.waiting import eventually

NAMESPACE = "gpuop-system"


@pytest.fixture
async def cluster() -> AsyncIterator[SimCluster]:
    async with SimCluster(nodes=2, gpus=2, workloads=True, seed=3) as running:
        await running.settle()
        yield running


@pytest.fixture
async def kube(cluster: SimCluster, tmp_path: Path) -> AsyncIterator[client.Kube]:
    async with await client.connect(cluster.write_kubeconfig(tmp_path / "kubeconfig")) as api:
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        with contextlib.suppress(errors.AlreadyExists):
            await api.call(api.core.create_namespace, namespace)
        yield api


def run_pod(action_id: str, timeout: int = 30) -> actions.RunValidationPod:
    return actions.RunValidationPod(
        id=action_id,
        image="nvcr.io/nvidia/cuda:12.2.2-base-ubuntu22.04",
        command=("nvidia-smi", "-L"),
        namespace=NAMESPACE,
        runtime_class_name="",
        timeout_seconds=timeout,
    )


async def validation_pods(kube: client.Kube) -> list[str]:
    listed = await kube.call(
        kube.core.list_namespaced_pod, NAMESPACE, label_selector=validationpods.LABEL
    )
    return [p["metadata"]["name"] for p in listed.get("items") or []]


async def empty_and_cordon(executor: KubeExecutor, node: str) -> None:
    await executor.execute(node, actions.Cordon(id="cordon"))
    await executor.execute(
        node,
        actions.DeletePods(
            id="delete", components=(Component.GPU,), force=True, timeout_seconds=30,
            delete_empty_dir=True,
        ),
    )  # fmt: skip


async def test_the_pod_succeeds_on_the_cordoned_node_and_is_deleted_after(
    cluster: SimCluster, kube: client.Kube
) -> None:
    node = cluster.node_names[0]
    executor = KubeExecutor(kube, EventRecorder(kube))
    await empty_and_cordon(executor, node)

    started = time.monotonic()
    outcome = await executor.execute(node, run_pod("validate-pod-1"))

    assert isinstance(outcome, observed.ValidationPodSucceeded), outcome
    assert outcome.action_id == "validate-pod-1"
    assert outcome.pod.name == validationpods.pod_name(node, "validate-pod-1")
    assert time.monotonic() - started < 3, "a healthy node's pod must not slow a rollout"
    assert await validation_pods(kube) == []


async def test_the_pod_is_bound_requests_one_gpu_and_tolerates_the_cordon() -> None:
    spec = validationpods.PodSpec("img", ("true",), NAMESPACE, "nvidia")
    pod = validationpods.manifest("gpu-1", "p", spec)
    assert pod["spec"]["nodeName"] == "gpu-1"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    assert pods.gpu_resources(pod) == frozenset({"nvidia.com/gpu"})
    tolerated = {t["key"] for t in pod["spec"]["tolerations"]}
    assert {"node.kubernetes.io/unschedulable", "gpuop.io/driver-not-ready"} <= tolerated


async def test_a_pod_the_kubelet_cannot_admit_is_tried_again_until_the_timeout(
    cluster: SimCluster, kube: client.Kube
) -> None:
    node = cluster.node_names[0]
    executor = KubeExecutor(kube, EventRecorder(kube))
    await empty_and_cordon(executor, node)
    hog = validationpods.manifest(
        node, "gpu-hog", validationpods.PodSpec("img", ("sleep", "inf"), NAMESPACE)
    )
    hog["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    del hog["metadata"]["labels"]
    await kube.call(kube.core.create_namespaced_pod, NAMESPACE, hog)
    await eventually(lambda: running(kube, "gpu-hog"))

    outcome = await executor.execute(node, run_pod("validate-pod-2", timeout=3))

    assert isinstance(outcome, observed.ValidationPodFailed), outcome
    assert outcome.reason is observed.ValidationPodFailureReason.TIMEOUT
    assert outcome.message.startswith("Timeout: not Succeeded within 3 s: OutOfnvidia.com/gpu")
    assert outcome.pod.name != validationpods.pod_name(node, "validate-pod-2")  # tried again
    assert await validation_pods(kube) == []


async def test_a_pod_admitted_once_the_gpus_are_free_again_succeeds(
    cluster: SimCluster, kube: client.Kube
) -> None:
    node = cluster.node_names[0]
    executor = KubeExecutor(kube, EventRecorder(kube))
    await empty_and_cordon(executor, node)
    hog = validationpods.manifest(
        node, "gpu-hog", validationpods.PodSpec("img", ("sleep", "inf"), NAMESPACE)
    )
    hog["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    del hog["metadata"]["labels"]
    await kube.call(kube.core.create_namespaced_pod, NAMESPACE, hog)
    await eventually(lambda: running(kube, "gpu-hog"))

    async def release() -> None:
        await asyncio.sleep(0.5)  # as a device plugin advertising its GPUs again
        await pods.delete(kube, pods.PodRef(NAMESPACE, "gpu-hog"), grace_period_seconds=0)

    freeing = asyncio.create_task(release())
    outcome = await executor.execute(node, run_pod("validate-pod-5", timeout=20))
    await freeing

    assert isinstance(outcome, observed.ValidationPodSucceeded), outcome
    assert outcome.pod.name != validationpods.pod_name(node, "validate-pod-5")
    assert await validation_pods(kube) == []


async def running(kube: client.Kube, name: str) -> bool:
    pod = await kube.call(kube.core.read_namespaced_pod, name, NAMESPACE)
    return pods.phase(pod) == "Running"


async def test_a_pod_that_never_starts_reports_its_timeout(
    cluster: SimCluster, kube: client.Kube
) -> None:
    node = cluster.node_names[0]
    executor = KubeExecutor(kube, EventRecorder(kube))
    await empty_and_cordon(executor, node)
    cluster.power_off(node)

    outcome = await executor.execute(node, run_pod("validate-pod-3", timeout=1))

    assert isinstance(outcome, observed.ValidationPodFailed), outcome
    assert outcome.reason is observed.ValidationPodFailureReason.TIMEOUT
    assert outcome.message == "Timeout: not Succeeded within 1 s: the pod was Pending"


async def test_a_pod_in_a_namespace_that_does_not_exist_is_refused(
    cluster: SimCluster, kube: client.Kube
) -> None:
    node = cluster.node_names[0]
    executor = KubeExecutor(kube, EventRecorder(kube))
    action = run_pod("validate-pod-4")
    missing = actions.RunValidationPod(**{**action.__dict__, "namespace": "nowhere"})

    outcome = await executor.execute(node, missing)

    assert isinstance(outcome, observed.ValidationPodFailed), outcome
    assert outcome.reason is observed.ValidationPodFailureReason.REFUSED


async def test_on_a_dra_node_the_pod_holds_a_claim_and_is_pinned_not_bound() -> None:
    spec = validationpods.PodSpec("img", ("true",), NAMESPACE, device_class="gpu.nvidia.com")
    pod = validationpods.manifest("gpu-1", "p", spec)
    assert "nodeName" not in pod["spec"], "a claim is allocated by the scheduler only"
    assert pods.gpu_resources(pod) == frozenset()
    [container] = pod["spec"]["containers"]
    assert container["resources"] == {"claims": [{"name": "gpu"}]}
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "p"}]
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                       "values": ["gpu-1"]}]}]  # fmt: skip
    claim = validationpods.claim_manifest("gpu-1", "p", spec)
    [request] = claim["spec"]["devices"]["requests"]
    exactly = {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}
    assert request == {"name": "gpu", "exactly": exactly}
    assert claim["metadata"]["namespace"] == NAMESPACE
