"""The chart for real: `helm install` (the real Helm) onto the control plane with the real
node, and every DaemonSet, Deployment and StatefulSet pod Running and Ready on the real
kubelet, with the chart's own security contexts, mounts, ServiceAccounts and its default
(callout) NATS auth; the images are `make image`'s, imported into the node's containerd.

The node agents reach NVML with no NVIDIA container toolkit on the node: they load the
driver's own libnvidia-ml from the user space the driver-manager installed under the host
root, mounted read-only (the chart's default). Here the node is a simulated GPU node, so
they run the simulated NVML (`nodeAgents.nvml: sim:8`, from the test image with gpuop-sim)
on its host root (`nodeAgents.hostRoot`); the cluster roles and NATS are allowed onto the
one node, a GPU node the chart keeps them off (`tests.support.node_chart` says why each
override). Evidence the simulated NVML answered inside the pods: discovery's labels
(`nvidia.com/gpu.count: 8`) and the device plugin's 8 GPUs in the node's allocatable,
registered with the real kubelet."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.real_node.conftest import GPUS
from tests.support import fleet, node_chart
from tests.support.dns_capture import DnsCapture
from tests.support.real_node import CLUSTER_DOMAIN, RealNode

pytestmark = [pytest.mark.real_node]

WORKLOADS = {
    "DaemonSet": {
        "gpuop-discovery", "gpuop-driver-manager", "gpuop-device-plugin", "gpuop-telemetry",
    },
    "Deployment": {
        "gpuop-discovery-cluster", "gpuop-network-manager-cluster", "gpuop-telemetry-cluster",
        "gpuop-device-plugin-cluster", "gpuop-upgrade-orchestrator", "gpuop-nats-auth",
    },
    "StatefulSet": {"gpuop-nats"},
}  # fmt: skip
"""The release's workloads with a pod on this node. The network-manager's DaemonSet follows
the Mellanox NIC label, which the recorded H200 node (no NIC of that vendor) never gets."""


@pytest.fixture(scope="module")
def installed(node: RealNode) -> Iterator[list[dict[str, Any]]]:
    node_chart.install(node.plane, node)
    try:
        running = node_chart.wait_ready(node.plane)
        print("\n" + node_chart.table(node.plane))
        yield running
    finally:
        node_chart.uninstall(node.plane)


def _owner(pod: dict[str, Any]) -> tuple[str, str]:
    (reference,) = pod["metadata"]["ownerReferences"]
    name = reference["name"]
    if reference["kind"] == "ReplicaSet":
        return "Deployment", name.rsplit("-", 1)[0]
    return reference["kind"], name


def test_every_pod_of_the_chart_is_running_and_ready_on_the_real_kubelet(
    node: RealNode, installed: list[dict[str, Any]]
) -> None:
    owners: dict[str, set[str]] = {}
    for pod in installed:
        assert pod["spec"]["nodeName"] == node.name
        kind, name = _owner(pod)
        owners.setdefault(kind, set()).add(name)
    assert owners == WORKLOADS
    replicas = [p for p in installed if _owner(p) == ("Deployment", "gpuop-upgrade-orchestrator")]
    assert len(replicas) == 2


def test_the_pods_run_with_the_charts_own_security_contexts_and_accounts(
    node: RealNode, installed: list[dict[str, Any]]
) -> None:
    """As the chart renders them, unchanged by the install: the kubelet ran these."""
    rendering = fleet.kubectl(
        node.plane, "get", "daemonsets,deployments,statefulsets", "-n", node_chart.NAMESPACE,
        "-o", "json",
    )  # fmt: skip
    assert rendering.returncode == 0, rendering.stderr
    by_pod = {p["metadata"]["name"]: p for p in installed}
    for pod in by_pod.values():
        spec = pod["spec"]
        kind, name = _owner(pod)
        if kind == "DaemonSet":
            assert spec["serviceAccountName"] == name  # callout: one account per service
            assert spec["automountServiceAccountToken"] is False
        main = spec["containers"][0]
        if name == "gpuop-driver-manager":
            assert main["securityContext"]["privileged"] is True
        elif name != "gpuop-nats":
            assert main["securityContext"]["allowPrivilegeEscalation"] is False
            assert main["securityContext"]["readOnlyRootFilesystem"] is True
    discovery = next(p for p in installed if _owner(p) == ("DaemonSet", "gpuop-discovery"))
    mounts = {m["mountPath"]: m for m in discovery["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/host/opt/gpuop/gpu"]["readOnly"] is True


def test_the_node_agents_answered_from_the_simulated_nvml(
    node: RealNode, installed: list[dict[str, Any]]
) -> None:
    current = node.plane.call("GET", f"/api/v1/nodes/{node.name}")
    labels = current["metadata"]["labels"]
    assert labels.get("nvidia.com/gpu.count") == str(GPUS), labels
    assert labels.get("feature.node.kubernetes.io/pci-10de.present") == "true"
    assert current["status"]["allocatable"].get("nvidia.com/gpu") == str(GPUS)


def test_no_dns_query_of_the_charts_left_the_machine(
    node: RealNode, installed: list[dict[str, Any]], dns_capture: DnsCapture
) -> None:
    """Last in the module: the chart's pods resolved the NATS and apiserver Services through
    the cluster DNS only. A query that names the cluster's domain, the images' registry
    (gpuop.local) or the node fails it (the machine may be shared)."""
    dns_capture.stop()
    mine = (CLUSTER_DOMAIN, "gpuop.local", node.name, "gpuop-nats", "kubernetes")
    ours = [
        name
        for name in (q.lower().rstrip(".") for q in dns_capture.queries())
        if any(name == m or name.endswith("." + m) or name.startswith(m + ".") for m in mine)
    ]
    assert dns_capture.interfaces, "no outward interface to watch"
    assert ours == [], json.dumps(dns_capture.packets(), indent=1)
