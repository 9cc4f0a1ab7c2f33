"""Workload pods on the real node and what the kubelet did to them: shared by the real-node
rollout and DRA quarantine tests."""

from __future__ import annotations

import json
from typing import Any

from tests.support import node_rollouts, tiny_images
from tests.support.control_plane import ControlPlane

NAMESPACE = "default"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
GPU = "nvidia.com/gpu"
XID = 95
"""Uncontained ECC error: the catalog's answer is a reset of that GPU."""
GRACE = 30
"""The workload pods' termination grace: their shell exits at the SIGTERM, long before."""
SCRIPT = (
    "trap 'echo stopping on SIGTERM; exit 0' TERM; echo started; "
    "while :; do sleep 3600 & wait $!; done"
)


def workload(name: str, gpus: int, **labels: str) -> dict[str, Any]:
    """A pod on the real node that says `started`, and exits 0 at its SIGTERM."""
    container: dict[str, Any] = {
        "name": "main",
        "image": tiny_images.BUSYBOX,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", SCRIPT],
    }
    if gpus:
        container["resources"] = {"limits": {GPU: gpus}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": GRACE,
            "nodeSelector": {"gpuop.io/real-node": "true"},
            "containers": [container],
        },
    }


def phase(plane: ControlPlane, name: str) -> str | None:
    status, body = plane.request(f"{PODS}/{name}")
    return json.loads(body)["status"].get("phase") if status == 200 else None


def stopped_by_kubelet(
    plane: ControlPlane, watch: node_rollouts.PodWatch, name: str
) -> dict[str, Any]:
    """The pod's last status before it was gone, printed with the kubelet's events of it: it
    was deleted with its own grace period (an eviction, not a forced delete), the kubelet
    stopped its container, and the pod is gone."""
    versions = watch.versions(NAMESPACE, name)
    assert versions and versions[-1][0] == "DELETED", [kind for kind, _ in versions]
    ends = [end for _, pod in versions if (end := node_rollouts.terminated(pod)) is not None]
    assert ends, f"the kubelet never reported {name}'s container terminated"
    # the first version marked for deletion: the kubelet's own final delete, once the
    # container stopped, has a grace of 0
    deleting = [pod["metadata"] for _, pod in versions if pod["metadata"].get("deletionTimestamp")]
    grace = deleting[0].get("deletionGracePeriodSeconds")
    events = node_rollouts.events_of(plane, NAMESPACE, name)
    print(f"\n{name}: kubelet's events:\n  " + "\n  ".join(events))
    print(f"{name}: deleted with a grace of {grace} s; container terminated as the kubelet "
          f"reported it: {json.dumps(ends[-1])}")  # fmt: skip
    assert plane.request(f"{PODS}/{name}")[0] == 404
    assert any(line.startswith("Normal Killing (kubelet)") for line in events), events
    assert grace == GRACE, grace
    return ends[-1]
