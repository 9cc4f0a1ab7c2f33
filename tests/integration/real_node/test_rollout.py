"""A rollout that touches real pods: the upgrade saga and the GPU remediation on the real node
among KWOK nodes (`tests.support.node_rollouts`: gpuop's node agents running for real on the
real node, fake agents for the KWOK nodes, the orchestrator through the admin's kubeconfig).

The upgrade: a GPU pod under a PodDisruptionBudget that allows no disruption and a pod
without GPUs run on the real node; the orchestrator's eviction of the GPU pod is refused
(429) and retried while the node waits in pod-deletion-required, until the budget allows
one; the kubelet then stops each evicted pod gracefully (its `Killing` event, the
container's exit as the kubelet reported it, the pod gone); the driver-manager reloads the
driver on the host root, the validation ladder's pod runs on the cordoned real node to
Succeeded, and every node ends upgrade-done and uncordoned.

The remediation: two pods hold one GPU each; an XID put on one GPU in the real node's
simulated NVML reaches telemetry, and only that GPU's holder is stopped by the kubelet;
the other keeps its container (same id, no restart).

Each test prints the evidence: the kubelet's events and the evicted container's last status,
the budget's refusals from the apiserver's audit log, the validation pod's end.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuop.bus import Buckets, NatsServer
from gpuop.events.remediation import RemediationState
from gpuop.events.upgrade import UpgradeState
from gpuop.host import cdi
from gpuop.host.roots import HostRoot
from gpuop.kube import validationpods
from gpuop.saga.actions import STATE_LABEL
from gpuop.saga.remediation.records import RemediationSaga
from gpuop.services.upgrade_orchestrator.remediations import REMEDIATION
from gpuop.services.upgrade_orchestrator.store import SagaStore
from gpuop_sim.nvml import sim_xids
from tests.integration.real_node.conftest import GPUS, Cluster, started_cluster
from tests.support import node_rollouts, tiny_images
from tests.support.control_plane import ControlPlane
from tests.support.node_workloads import (
    GPU,
    NAMESPACE,
    PODS,
    XID,
    phase,
    stopped_by_kubelet,
    workload,
)
from tests.support.real_node import RealNode
from tests.support.waiting import eventually

pytestmark = [pytest.mark.real_node, pytest.mark.nats]

NEW = "580.200.01"
KWOK_RUNNING = "570.1"
KWOK_NODES = 2
BUDGETS = f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets"
WAIT = {"timeout": 180, "interval": 0.5}
LIBRARY = f"{cdi.LIBRARY_DIR}/libnvidia-ml.so.1"
VALIDATE = f"{{ ls /dev | grep nvidia; cat {LIBRARY}; }} > /dev/termination-log"
"""The validation pod's command: what it saw of the GPU it was given goes into its
termination message, which the kubelet reports in its status (the pod is deleted after)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The real node (8 simulated GPUs) and 2 KWOK GPU nodes."""
    with started_cluster(tmp_path_factory, kwok_nodes=KWOK_NODES) as started:
        yield started


async def start(plane: ControlPlane, *pods: dict[str, Any]) -> None:
    for pod in pods:
        plane.call("POST", PODS, pod)
    for pod in pods:
        name = pod["metadata"]["name"]

        def running(name: str = name) -> bool:
            return phase(plane, name) == "Running"

        await eventually(running, **WAIT)


async def gpus_offered(node: RealNode, allocatable: int = GPUS) -> None:
    def offered() -> bool:
        status = node.plane.call("GET", f"/api/v1/nodes/{node.name}")["status"]
        return bool(status.get("allocatable", {}).get(GPU) == str(allocatable))

    await eventually(offered, **WAIT)


def state_of(plane: ControlPlane, node: str) -> str | None:
    labels = plane.call("GET", f"/api/v1/nodes/{node}")["metadata"].get("labels") or {}
    return labels.get(STATE_LABEL)


def evictions(plane: ControlPlane, pod: str) -> list[tuple[int, str]]:
    """The evictions of `pod` the apiserver answered, from its audit log: the status code
    (429: a budget allowed none) and one line each."""
    found = []
    for event in plane.audit_events():
        ref = event.get("objectRef") or {}
        if ref.get("subresource") == "eviction" and ref.get("name") == pod:
            code = event["responseStatus"]["code"]
            found.append(
                (code, f"{event['stageTimestamp']} {event['verb']} {pod}/eviction: {code}")
            )
    return found


def refusals(plane: ControlPlane, pod: str) -> list[str]:
    return [line for code, line in evictions(plane, pod) if code == 429]


@pytest.mark.timeout(600)
async def test_the_upgrade_waits_on_a_budget_the_kubelet_stops_the_evicted_pods_and_a_real_pod_validates(  # noqa: E501
    cluster: Cluster, nats_server: NatsServer, tmp_path: Path
) -> None:
    plane, node = cluster.plane, cluster.node
    old = node_rollouts.driver_version(node)
    source = node_rollouts.driver_source(node, node.work / "driver-source", (old, NEW))
    node_rollouts.preinstall(node, NEW)
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "trainer", "namespace": NAMESPACE},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "trainer"}}},
    }
    with node_rollouts.PodWatch(plane, tmp_path / "pods.json") as watch:
        async with node_rollouts.orchestrating(
            plane, node, cluster.kwok, nats_server, gpus=GPUS, kwok_version=KWOK_RUNNING
        ) as orchestrator:
            await gpus_offered(node)
            plane.call("POST", BUDGETS, budget)
            await start(plane, workload("trainer", 2, app="trainer"), workload("web", 0))
            node_rollouts.apply_policy(plane, _upgrade(source))

            await eventually(lambda: len(refusals(plane, "trainer")) >= 2, **WAIT)
            waiting = state_of(plane, node.name)
            still = phase(plane, "trainer")
            print(
                "\nthe budget's refusals (audit log):\n  " + "\n  ".join(refusals(plane, "trainer"))
            )
            plane.call(
                "PATCH", f"{BUDGETS}/trainer", {"spec": {"minAvailable": 0}},
                content_type="application/merge-patch+json",
            )  # fmt: skip

            def done() -> bool:
                names = [node.name, *cluster.kwok]
                return all(state_of(plane, n) == UpgradeState.UPGRADE_DONE for n in names)

            await eventually(done, timeout=300, interval=1.0)
            current = plane.call("GET", f"/api/v1/nodes/{node.name}")
            tried = evictions(plane, "trainer")
            print("every eviction of trainer (audit log):\n  " + "\n  ".join(t for _, t in tried))
        validations = [
            pod
            for kind, pod in watch.events()
            if (pod["metadata"].get("labels") or {}).get(validationpods.LABEL) == node.name
        ]
        trainer = stopped_by_kubelet(plane, watch, "trainer")
        web = stopped_by_kubelet(plane, watch, "web")

    assert set(orchestrator.exit_codes.values()) == {0}, orchestrator.exit_codes
    assert waiting == UpgradeState.POD_DELETION_REQUIRED and still == "Running"
    # refused while the budget allowed no disruption, then once it allowed one, evicted
    assert tried[-1][0] == 201 and {code for code, _ in tried[:-1]} == {429}, tried
    assert trainer["exitCode"] == 0 and trainer["reason"] == "Completed", trainer
    assert web["exitCode"] == 0, web
    succeeded = [p for p in validations if p["status"].get("phase") == "Succeeded"]
    assert succeeded, [p["status"].get("phase") for p in validations]
    ran = succeeded[-1]
    print(
        f"validation pod {ran['metadata']['name']} on {ran['spec']['nodeName']}: "
        f"{ran['status']['phase']}, {json.dumps(node_rollouts.terminated(ran))}"
    )
    assert ran["spec"]["nodeName"] == node.name
    saw = (node_rollouts.terminated(ran) or {}).get("message", "")
    assert f"userspace/lib/libnvidia-ml.so.{NEW}" in saw, saw
    assert len([n for n in saw.split() if re.fullmatch(r"nvidia\d+", n)]) == 1, saw
    assert not current["spec"].get("unschedulable"), current["spec"]
    assert node_rollouts.driver_version(node) == NEW


ON_THE_NODE: dict[str, Any] = {
    "podDeletion": {"force": True, "timeoutSeconds": 240},
    "validation": {
        "rungs": ["nvml", "cuda", "pod"],
        "pod": {"image": tiny_images.BUSYBOX, "command": ["sh", "-c", VALIDATE]},
    },
}
"""What both scenarios need of the upgrade policy: the workloads are bare pods, so evicting
them takes `force` (as with `kubectl drain`); the validation pod is the node's own busybox
(nothing is pulled)."""


def _upgrade(source: Path) -> dict[str, Any]:
    return {
        "driver": node_rollouts.driver_spec(source, NEW),
        "upgradePolicy": {
            "maxParallelUpgrades": 3,
            "maxUnavailable": 3,
            "drain": {"enable": True, "force": True, "deleteEmptyDir": True, "timeoutSeconds": 120},
            **ON_THE_NODE,
        },
    }


@pytest.mark.timeout(600)
async def test_an_xid_on_one_gpu_stops_only_its_holder_on_the_kubelet(
    cluster: Cluster, nats_server: NatsServer, tmp_path: Path
) -> None:
    plane, node = cluster.plane, cluster.node
    running = node_rollouts.driver_version(node)
    source = node_rollouts.driver_source(node, node.work / "driver-source", (running, NEW))
    with node_rollouts.PodWatch(plane, tmp_path / "pods.json") as watch:
        async with node_rollouts.orchestrating(
            plane, node, cluster.kwok, nats_server, gpus=GPUS, kwok_version=running
        ) as orchestrator:
            await gpus_offered(node)
            node_rollouts.apply_policy(
                plane,
                {
                    "driver": node_rollouts.driver_spec(source, running),
                    "upgradePolicy": ON_THE_NODE,
                },
            )
            await start(plane, workload("holder-a", 1), workload("holder-b", 1))
            held = {name: _gpu_of(node, name) for name in ("holder-a", "holder-b")}
            kept_before = _container(node, "holder-b")
            print(f"\nGPUs held: {held}")
            store = SagaStore(await orchestrator.bus.kv(Buckets.SAGAS), REMEDIATION)

            async def remediated() -> RemediationSaga | None:
                stored = await store.get(node.name)
                if stored is None:  # telemetry reads the XID only while its watcher is open
                    sim_xids.inject(node.host_root, held["holder-a"], XID)
                    return None
                ended = stored.saga.state in (RemediationState.DONE, RemediationState.FAILED)
                return stored.saga if ended else None

            saga = await eventually(remediated, timeout=180, interval=2.0)
            assert saga.state is RemediationState.DONE, saga.failure
            walked = [f"{step.state} {step.step}: {step.detail}" for step in saga.history]
            print("the remediation's steps:\n  " + "\n  ".join(walked))
            kept_after = _container(node, "holder-b")
            other = plane.call("GET", f"{PODS}/holder-b")
        stopped = stopped_by_kubelet(plane, watch, "holder-a")
        plane.request(f"{PODS}/holder-b", method="DELETE", body={"gracePeriodSeconds": 0})

    print(f"holder-b kept: container {kept_after['id'][:13]}, restarts {kept_after['restarts']}")
    assert set(orchestrator.exit_codes.values()) == {0}, orchestrator.exit_codes
    assert stopped["exitCode"] == 0, stopped
    assert kept_after == kept_before and kept_after["restarts"] == 0
    (status,) = other["status"]["containerStatuses"]
    assert other["status"]["phase"] == "Running" and status["restartCount"] == 0
    assert status["containerID"].endswith(kept_before["id"])


def _gpu_of(node: RealNode, pod: str) -> str:
    """The GPU uuid the plugin gave `pod`'s container, from the CDI devices containerd
    injected."""
    container = _container(node, pod)["id"]
    inspected = json.loads(node.crictl("inspect", container).stdout)
    (device,) = [d["name"] for d in inspected["info"]["config"]["CDI_devices"]]
    uuid = device.removeprefix(f"{cdi.KIND}=")
    assert uuid in cdi.device_names(cdi.spec_path(HostRoot(node.host_root))), uuid
    return str(uuid)


def _container(node: RealNode, pod: str) -> dict[str, Any]:
    """The pod's `main` container as containerd has it: its id and the kubelet's restarts."""
    label = f"io.kubernetes.pod.name={pod}"
    listed = json.loads(node.crictl("ps", "--name", "main", "--label", label, "-o", "json").stdout)
    (container,) = listed["containers"]
    restarts = container["annotations"].get("io.kubernetes.container.restartCount", "0")
    return {"id": container["id"], "restarts": int(restarts)}
