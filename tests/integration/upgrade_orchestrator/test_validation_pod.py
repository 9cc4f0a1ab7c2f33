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
from gpuop_sim.apiserver import kinds
from tests.support.waiting import eventually

NAMESPACE = "gpuop-system"
DCGM = "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"


@pytest.fixture
async def cluster(request: pytest.FixtureRequest) -> AsyncIterator[SimCluster]:
    workloads = getattr(request, "param", True)  # False: two idle nodes
    async with SimCluster(nodes=2, gpus=2, workloads=workloads, seed=3) as running:
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


def preflight(action_id: str, timeout: int = 10) -> actions.RunValidationPod:
    return actions.RunValidationPod(
        id=action_id, image=DCGM, command=("dcgmi", "diag", "-r", "1"), namespace=NAMESPACE,
        runtime_class_name="", timeout_seconds=timeout, all_gpus=True,
    )  # fmt: skip


def requested_gpus(cluster: SimCluster, seen: list[str]) -> None:
    for pod in cluster.registry.store.view(kinds.PODS.group_resource, NAMESPACE):
        if validationpods.LABEL not in pod["metadata"].get("labels", {}):
            continue
        [container] = pod["spec"]["containers"]
        seen.append(container["resources"]["limits"]["nvidia.com/gpu"])


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


@pytest.mark.parametrize(("diagnostic", "gpus"), [(False, "1"), (True, "2")])
async def test_the_pod_succeeds_on_the_cordoned_node_and_is_deleted_after(
    cluster: SimCluster, kube: client.Kube, diagnostic: bool, gpus: str
) -> None:
    """The pod rung's asks one GPU; the preflight's diagnostic every GPU of the node, as its
    capacity counts them."""
    node = cluster.node_names[0]
    executor = KubeExecutor(kube, EventRecorder(kube))
    await empty_and_cordon(executor, node)
    seen: list[str] = []
    cluster.registry.store.observe(lambda change: requested_gpus(cluster, seen))

    started = time.monotonic()
    run = preflight("validate-pod-1") if diagnostic else run_pod("validate-pod-1")
    outcome = await executor.execute(node, run)

    assert isinstance(outcome, observed.ValidationPodSucceeded), outcome
    assert outcome.action_id == "validate-pod-1"
    assert outcome.pod.name == validationpods.pod_name(node, "validate-pod-1")
    assert time.monotonic() - started < 3, "a healthy node's pod must not slow a rollout"
    assert set(seen) == {gpus}
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


@pytest.mark.parametrize("diagnostic", [False, True])
async def test_a_pod_that_never_starts_reports_its_timeout_and_what_it_waited_for(
    cluster: SimCluster, kube: client.Kube, diagnostic: bool
) -> None:
    node = cluster.node_names[0]
    executor = KubeExecutor(kube, EventRecorder(kube))
    await empty_and_cordon(executor, node)
    cluster.power_off(node)

    run = preflight("preflight-5", timeout=1) if diagnostic else run_pod("validate-pod-3", 1)
    outcome = await executor.execute(node, run)

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


# The preflight rung's diagnostic: every GPU of the node; a diagnostic the simulated kubelet
# makes fail on a named node fails with its exit code and last log lines.

DIAG_LOG = "Diagnostic | Result\nGPU Memory | Fail - GPU 1: uncorrectable DBE"


@pytest.mark.parametrize("cluster", [False], indirect=True)
async def test_a_failing_diagnostic_fails_the_rung_with_its_exit_code_and_last_log_lines(
    cluster: SimCluster, kube: client.Kube
) -> None:
    faulty, healthy = cluster.node_names
    cluster.fail_diagnostics(faulty, 226, DIAG_LOG, image=DCGM)
    executor = KubeExecutor(kube, EventRecorder(kube))
    for node in (faulty, healthy):
        await executor.execute(node, actions.Cordon(id=f"cordon-{node}"))

    failed = await executor.execute(faulty, preflight("preflight-2"))
    passed = await executor.execute(healthy, preflight("preflight-3"))
    other_image = await executor.execute(
        faulty,
        actions.RunValidationPod(
            id="validate-pod", image="nvcr.io/nvidia/cuda:12.2.2-base-ubuntu22.04",
            command=("nvidia-smi", "-L"), namespace=NAMESPACE, runtime_class_name="",
            timeout_seconds=10,
        ),
    )  # fmt: skip

    assert isinstance(failed, observed.ValidationPodFailed), failed
    assert failed.reason is observed.ValidationPodFailureReason.FAILED
    assert failed.message.startswith("Failed: validator exited 226 (Error): Diagnostic | Result")
    assert "GPU Memory | Fail - GPU 1: uncorrectable DBE" in failed.message
    assert isinstance(passed, observed.ValidationPodSucceeded), "the fault is the named node's"
    assert isinstance(other_image, observed.ValidationPodSucceeded), "and the named image's"

    cluster.fail_diagnostics(faulty, 0)
    healed = await executor.execute(faulty, preflight("preflight-4"))
    assert isinstance(healed, observed.ValidationPodSucceeded), healed


def test_a_waiting_container_is_the_timeouts_reason() -> None:
    waiting = {"reason": "ErrImagePull", "message": f'pull "{DCGM}": not found'}
    pod = {"status": {"phase": "Pending", "containerStatuses": [
        {"name": "validator", "state": {"waiting": waiting}}]}}  # fmt: skip
    assert validationpods._waiting(pod) == (
        f'validator waiting: ErrImagePull (pull "{DCGM}": not found)'
    )


def test_the_diagnostic_reports_its_logs_on_error_and_claims_every_device_on_dra() -> None:
    spec = validationpods.PodSpec(DCGM, ("dcgmi",), NAMESPACE, all_gpus=True, gpus=8)
    [container] = validationpods.manifest("gpu-1", "p", spec)["spec"]["containers"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "8"}}
    on_dra = validationpods.PodSpec(
        DCGM, ("dcgmi",), NAMESPACE, device_class="gpu.nvidia.com", all_gpus=True
    )
    claim = validationpods.claim_manifest("gpu-1", "p", on_dra)
    [request] = claim["spec"]["devices"]["requests"]
    assert request["exactly"]["allocationMode"] == "All"
    assert "count" not in request["exactly"] and "selectors" not in request["exactly"]
    assert request["exactly"]["tolerations"][0]["key"] == "gpuop.io/gpu-unhealthy"
