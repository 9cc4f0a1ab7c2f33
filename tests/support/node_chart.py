"""The chart installed by the real Helm onto a control plane with the real node
(`tests.support.real_node`): its pods run on the real kubelet, with the chart's own security
contexts, mounts, ServiceAccounts and its default (callout) NATS auth. Used by the real-node
chart test and by `make cluster`.

What differs from a production install, each a values override (`values`):
- the images are the ones `make image` writes, imported into the node's containerd (never
  pulled): NATS's, and gpuop's with the simulation added (`gpuop.local/gpuop-sim`, a test
  layer on the product image: `tests.support.images.build.build_gpuop_sim`), so the node
  agents run `nodeAgents.nvml: sim:<gpus>`, the simulated NVML, on the node's simulated
  GPU host root (`nodeAgents.hostRoot`: every host path they mount is under it, so they see
  the recorded H200 node's sysfs and procfs, not this machine's, and the driver-manager works
  there rather than in this machine's `/`);
- the kubelet's root directory is the real node's (`nodeAgents.kubeletRootDir`, its
  `--root-dir` in its work directory), which a link in the host root shows at its own path
  (`dra_nodes.show_kubelet_root`), as a node whose host root is `/` has it: the device
  plugin's DRA sockets and the PodResources sockets are where the kubelet has them;
- the cluster roles and NATS are allowed onto GPU nodes (`clusterRoles.avoidNodes: []`) and
  kept on the real node (`nodeSelector` its label `gpuop.io/real-node`; it gets the admin's
  label `clusterRoles.nodeLabel` names, as the chart's docs say): it is the one node
  that runs containers (KWOK's only pretend to), and a GPU node, which the chart keeps them
  off as the orchestrator drains GPU nodes;
- NATS's volume is a hostPath PersistentVolume in the node's work directory: the control
  plane runs no storage provisioner.
"""

from __future__ import annotations

import json
import time
from typing import Any

import yaml

from tests.support import dra_nodes, fleet
from tests.support.control_plane import ControlPlane, ControlPlaneError
from tests.support.images import build
from tests.support.real_node import RealNode

RELEASE, NAMESPACE = fleet.RELEASE, fleet.RELEASE_NAMESPACE
NATS_VOLUME = "gpuop-real-node-nats"
NATS_SIZE = "1Gi"
CONTROL_PLANE_LABEL = "node-restriction.kubernetes.io/gpuop-control-plane"
"""`clusterRoles.nodeLabel`'s default key."""
REAL = {"gpuop.io/real-node": "true"}
"""The label the real node registers with."""
READY_TIMEOUT = 420.0
"""Every pod Ready after the install, on a loaded two-core machine (a dozen Python
processes starting at once)."""


def images() -> tuple[build.Built, build.Built]:
    """gpuop's image with the simulation, and NATS's (`make image`, cached)."""
    return build.build_gpuop_sim(), build.build_nats()


def values(node: RealNode, gpuop: build.Built, nats: build.Built) -> dict[str, Any]:
    """The overrides the module docstring lists, for `node`."""
    repository, _, tag = gpuop.name.rpartition(":")
    nats_repository, _, nats_tag = nats.name.rpartition(":")
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "nodeAgents": {
            "nvml": f"sim:{node.gpus}",
            "hostRoot": str(node.host_root),
            "kubeletRootDir": str(node.kubelet_root.resolve()),
        },
        "clusterRoles": {"avoidNodes": [], "nodeSelector": REAL},
        "upgradeOrchestrator": {"nodeSelector": REAL},
        "nats": {
            "image": {"repository": nats_repository, "tag": nats_tag, "pullPolicy": "Never"},
            "persistence": {"size": NATS_SIZE},
            "nodeSelector": REAL,
        },
    }


def install(plane: ControlPlane, node: RealNode, *extra: str) -> tuple[build.Built, build.Built]:
    """Import the images into `node`, make NATS's volume, `helm install` with `values`
    (and `extra` Helm arguments); the images, gpuop's and NATS's."""
    gpuop, nats = images()
    node.import_archive(gpuop.path)
    node.import_archive(nats.path)
    _nats_volume(plane, node)
    _control_plane_node(plane, node)
    dra_nodes.show_kubelet_root(node)
    chosen = values(node, gpuop, nats)
    path = node.work / "chart-values.yaml"
    path.write_text(yaml.safe_dump(chosen), encoding="utf-8")
    fleet.helm(
        plane, "install", RELEASE, str(fleet.CHART), "--namespace", NAMESPACE,
        "--create-namespace", "--values", str(path), *extra,
    )  # fmt: skip
    return gpuop, nats


def _control_plane_node(plane: ControlPlane, node: RealNode) -> None:
    """The label, which only an admin may set, of the nodes the chart runs its keys on
    (`clusterRoles.nodeLabel`): as the chart's docs tell an admin to label them."""
    status, answer = plane.request(
        f"/api/v1/nodes/{node.name}",
        method="PATCH",
        body={"metadata": {"labels": {CONTROL_PLANE_LABEL: "true"}}},
        content_type="application/merge-patch+json",
    )
    if status != 200:
        raise ControlPlaneError(f"labelling {node.name}: {status} {answer.decode()}")


def _nats_volume(plane: ControlPlane, node: RealNode) -> None:
    data = node.work / "nats-volume"
    data.mkdir(exist_ok=True)
    data.chmod(0o777)  # the server runs as 1000; a hostPath volume is not chowned (fsGroup)
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": NATS_VOLUME},
        "spec": {
            "capacity": {"storage": NATS_SIZE},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": str(data), "type": "Directory"},
        },
    }
    status, answer = plane.request("/api/v1/persistentvolumes", method="POST", body=volume)
    if status not in (201, 409):
        raise ControlPlaneError(f"NATS's volume: {status} {answer.decode(errors='replace')}")


def pods(plane: ControlPlane) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = plane.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
    return found


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return pod["status"].get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def expected_pods(plane: ControlPlane) -> int:
    """Pods the release's workloads want now: each Deployment's and StatefulSet's replicas,
    each DaemonSet's desired count (the nodes its selector matches, which follow discovery's
    labels)."""
    total = 0
    for kind in ("deployments", "statefulsets"):
        listed = plane.call("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/{kind}")["items"]
        total += sum(int(w["spec"].get("replicas", 1)) for w in listed)
    daemons = plane.call("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets")["items"]
    return total + sum(int(d["status"].get("desiredNumberScheduled", 0)) for d in daemons)


def wait_ready(
    plane: ControlPlane, timeout: float = READY_TIMEOUT, settle: float = 20.0
) -> list[dict[str, Any]]:
    """Until every pod the release wants exists and is Running and Ready, and stays so for
    `settle` seconds (a DaemonSet whose nodes discovery labels late joins meanwhile); the
    pods. `ControlPlaneError` with each pod's state and the node's report otherwise."""
    deadline = time.monotonic() + timeout
    since: float | None = None
    while time.monotonic() < deadline:
        current = pods(plane)
        if current and len(current) == expected_pods(plane) and all(map(ready, current)):
            since = since or time.monotonic()
            if time.monotonic() - since >= settle:
                return current
        else:
            since = None
        time.sleep(1.0)
    raise ControlPlaneError(
        f"the chart's pods not all Ready within {timeout:g} s:\n{describe(plane)}"
    )


def describe(plane: ControlPlane) -> str:
    """Each pod's phase, its containers' states and its last log lines, for a failure."""
    lines = [table(plane)]
    for pod in pods(plane):
        name = pod["metadata"]["name"]
        for status in pod["status"].get("containerStatuses", []):
            lines.append(f"{name}/{status['name']}: {json.dumps(status.get('state'))}")
        logs = fleet.kubectl(plane, "logs", "-n", NAMESPACE, name, "--all-containers", "--tail=15")
        lines.append(logs.stdout[-3000:] + logs.stderr[-500:])
    events = fleet.kubectl(plane, "get", "events", "-n", NAMESPACE, "--sort-by=.lastTimestamp")
    lines.append(events.stdout[-4000:])
    return "\n".join(lines)


def table(plane: ControlPlane) -> str:
    """`kubectl get pods -n <namespace> -o wide`."""
    answer = fleet.kubectl(plane, "get", "pods", "-n", NAMESPACE, "-o", "wide")
    return answer.stdout + answer.stderr


def uninstall(plane: ControlPlane) -> None:
    """The release, its namespace's pods gone, and NATS's volume."""
    fleet.helm(plane, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", timeout=300)
    fleet.kubectl(plane, "delete", "pvc", "--all", "-n", NAMESPACE, "--wait=false")
    plane.request(f"/api/v1/persistentvolumes/{NATS_VOLUME}", method="DELETE")
