"""Where the chart puts what holds a key to the cluster, on the real control plane (issue 37,
findings 1 and 2): the NATS servers, the callout and the cluster roles go only onto nodes with
the admins' label (clusterRoles.nodeLabel). A GPU node's kubelet, whose credential root on that
node holds, may take its Node out of `avoidNodes` (nvidia.com/gpu.present is its to set) but
cannot give it the admins' label: the NodeRestriction admission plugin refuses it every label
under node-restriction.kubernetes.io/. So a pod with the chart's placement stays Pending until
an admin labels a node, and then runs there."""

from __future__ import annotations

import copy
import random
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpuop_sim.cluster import kwok, machines
from tests.support import fleet
from tests.support.charts import render
from tests.support.control_plane import ControlPlane
from tests.support.waiting import eventually

pytestmark = [pytest.mark.real_cluster, pytest.mark.security]

LABEL = "node-restriction.kubernetes.io/gpuop-control-plane"
GPU_PRESENT = "nvidia.com/gpu.present"
ATTACKER = "gpu-node-1"
"""The GPU node whose kubelet credential the attacker holds."""
CONTROL = "gpuop-control-1"
"""A node without GPUs, which the admin chooses for the keys."""
NAMESPACE = "gpuop-placement"


def outcome(done: subprocess.CompletedProcess[str]) -> str:
    return "allowed" if done.returncode == 0 else "refused: " + done.stderr.strip()


@pytest.fixture
def control_node(plane: ControlPlane) -> Iterator[str]:
    """A KWOK node without GPU labels, removed again with what ran on it."""
    machine = machines.Machine.create(CONTROL, 99, machines.machine_type(8), random.Random(0))
    node = machines.node_object(machine, datetime.now(UTC))
    node["metadata"]["annotations"][kwok.KWOK_ANNOTATION] = "fake"
    plane.call("POST", "/api/v1/nodes", node)
    plane.call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    try:
        yield CONTROL
    finally:
        plane.request(f"/api/v1/namespaces/{NAMESPACE}", method="DELETE")
        plane.request(f"/api/v1/nodes/{CONTROL}", method="DELETE")
        # the attacker's change undone, as an admin would
        patch = {"metadata": {"labels": {GPU_PRESENT: "true", LABEL: None}}}
        plane.call(
            "PATCH", f"/api/v1/nodes/{ATTACKER}", patch, content_type="application/merge-patch+json"
        )


def pod_with_the_charts_placement() -> dict[str, Any]:
    """A pod placed as the chart places its NATS servers (the same affinity as the cluster
    roles' and the callout's: tests/unit/deploy/test_chart_security.py)."""
    server = render("defaults").get("StatefulSet", f"{fleet.RELEASE}-nats")
    affinity = copy.deepcopy(server["spec"]["template"]["spec"]["affinity"]["nodeAffinity"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "holds-the-keys", "namespace": NAMESPACE},
        "spec": {
            "affinity": {"nodeAffinity": affinity},
            "containers": [{"name": "c", "image": "busybox"}],
        },
    }


async def test_a_kubelet_cannot_make_its_node_eligible_for_the_keys_and_an_admin_can(
    plane: ControlPlane, control_node: str, tmp_path: Path
) -> None:
    kubelet = plane.write_node_kubeconfig(tmp_path / "kubelet.kubeconfig", ATTACKER)
    admin = plane.admin_kubeconfig
    pod_path = f"/api/v1/namespaces/{NAMESPACE}/pods/holds-the-keys"

    def node(name: str) -> dict[str, Any]:
        found: dict[str, Any] = plane.call("GET", f"/api/v1/nodes/{name}")
        return found

    def unschedulable() -> bool:
        conditions = plane.call("GET", pod_path).get("status", {}).get("conditions", [])
        return any(
            c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions
        )

    def bound() -> str | None:
        name: str | None = plane.call("GET", pod_path)["spec"].get("nodeName")
        return name

    def schedulable(name: str) -> bool:
        found = node(name)
        ready = [c for c in found["status"].get("conditions", []) if c["type"] == "Ready"]
        taints = [t["key"] for t in found["spec"].get("taints", [])]
        return bool(ready) and ready[0]["status"] == "True" and kwok.NOT_READY_TAINT not in taints

    await eventually(lambda: schedulable(control_node), timeout=90)
    print("\nwho | attempt | outcome")
    rows = []

    def row(who: str, attempt: str, result: str) -> str:
        rows.append((who, attempt, result))
        print(f"{who} | {attempt} | {result}")
        return result

    attempts = [
        (f"kubelet of {ATTACKER}", kubelet, ATTACKER, f"{GPU_PRESENT}=false"),
        (f"kubelet of {ATTACKER}", kubelet, ATTACKER, f"{LABEL}=true"),
        (f"kubelet of {ATTACKER}", kubelet, control_node, f"{LABEL}=true"),
    ]
    for who, credential, target, label in attempts:
        done = fleet.kubectl_as(credential, "label", "node", target, label, "--overwrite")
        row(who, f"label node {target} {label}", outcome(done))
    # nvidia.com/gpu.present is the kubelet's to change: avoidNodes alone was no fence
    assert rows[0][2] == "allowed", rows[0]
    assert f"is not allowed to modify labels: {LABEL}" in rows[1][2], rows[1]
    assert rows[2][2].startswith("refused"), rows[2]  # another Node: the Node authorizer
    assert LABEL not in node(ATTACKER)["metadata"]["labels"]

    plane.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod_with_the_charts_placement())
    first = await eventually(lambda: bound() or unschedulable(), timeout=60)
    where = "Pending: no node fits" if first is True else f"on {first}"
    row("scheduler", "place a pod with the chart's placement", where)
    assert first is True, f"placed on {first} before an admin labelled a node"

    done = fleet.kubectl_as(admin, "label", "node", control_node, f"{LABEL}=true")
    assert row("admin", f"label node {control_node} {LABEL}=true", outcome(done)) == "allowed"
    placed = await eventually(bound, timeout=60)
    row("scheduler", "place a pod with the chart's placement", f"on {placed}")
    assert placed == control_node
