"""GPU nodes and workloads on the real control plane (`tests.support.control_plane`): the
same machines and the same workloads `gpuop_sim.SimCluster` runs, made through the real
API server. KWOK plays the kubelets; the real scheduler places the pods and the real
controllers own them.

`KwokCluster` stands where a `SimCluster` does for the end-to-end stack: node names, each
node's machine (its boot id and type, for its host root) and a kubeconfig.
"""

from __future__ import annotations

import datetime
import random
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuop_sim.apiserver.resources import ResourceType
from gpuop_sim.cluster import machines, workloads
from gpuop_sim.cluster.machines import Machine
from tests.support.control_plane import ControlPlane, ControlPlaneError, binary

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
SETTLE_TIMEOUT = 180.0
"""Seconds for every node to be Ready and untainted and every workload pod Running: the
scheduler and controllers place dozens of pods on two busy cores."""


def path_of(resource: ResourceType, namespace: str, name: str | None = None) -> str:
    base = "/api/v1" if not resource.group else f"/apis/{resource.group}/{resource.version}"
    scope = f"/namespaces/{namespace}" if resource.namespaced else ""
    return f"{base}{scope}/{resource.plural}" + (f"/{name}" if name else "")


def make_machines(
    count: int, gpus: int, *, seed: int = 0, prefix: str = "gpu-node-"
) -> list[Machine]:
    """The machines a `SimCluster` of the same size and seed would have."""
    rng = random.Random(seed)
    kind = machines.machine_type(gpus)
    return [Machine.create(f"{prefix}{index}", index, kind, rng) for index in range(1, count + 1)]


def create_nodes(plane: ControlPlane, count: int, gpus: int, *, seed: int = 0) -> list[str]:
    """Register `count` KWOK GPU nodes and wait until each is Ready and schedulable."""
    fleet = make_machines(count, gpus, seed=seed)
    register(plane, fleet, gpus)
    names = [machine.name for machine in fleet]
    wait_schedulable(plane, names)
    return names


def register(plane: ControlPlane, fleet: list[Machine], gpus: int) -> None:
    """Create a Node per machine, as its kubelet would register it, with the GPU Operator's
    labels on GPU nodes; KWOK takes over its status and lease."""
    now = datetime.datetime.now(datetime.UTC)
    for machine in fleet:
        node = machines.node_object(machine, now)
        if gpus:
            node["metadata"]["labels"].update(workloads.GPU_NODE_LABELS)
        plane.call("POST", "/api/v1/nodes", node)


def wait_schedulable(
    plane: ControlPlane, names: list[str], timeout: float = SETTLE_TIMEOUT
) -> None:
    """Until every node in `names` is Ready and the not-ready taint that TaintNodesAtCreation
    put on it is gone (the node lifecycle controller lifts it)."""
    deadline = time.monotonic() + timeout
    pending: list[str] = list(names)
    while time.monotonic() < deadline:
        listed = plane.call("GET", "/api/v1/nodes")["items"]
        by_name = {node["metadata"]["name"]: node for node in listed}
        pending = [name for name in names if not _schedulable(by_name.get(name))]
        if not pending:
            return
        time.sleep(0.5)
    raise ControlPlaneError(f"nodes not Ready and schedulable within {timeout:g} s: {pending}")


def _schedulable(node: dict[str, Any] | None) -> bool:
    if node is None:
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    taints = (node.get("spec") or {}).get("taints") or []
    return ready and not any(t.get("key") == NOT_READY_TAINT for t in taints)


def install_workloads(plane: ControlPlane, nodes: int, gpus: int) -> None:
    """The simulated cluster's workloads (`gpuop_sim.cluster.workloads.manifests`): the
    GPU Operator's driver DaemonSet, a monitoring DaemonSet, GPU Deployments under
    PodDisruptionBudgets and a GPU Job. Namespaces first, then the service accounts the
    ServiceAccount admission plugin needs before a pod may be made."""
    made = workloads.manifests(nodes, gpus, job_seconds=600)
    for resource, namespace, obj in made:
        body = {"apiVersion": resource.api_version, "kind": resource.kind, **obj}
        plane.call("POST", path_of(resource, namespace), body)
        if resource.kind == "Namespace":
            _wait_default_service_account(plane, obj["metadata"]["name"])


def _wait_default_service_account(plane: ControlPlane, namespace: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status, _ = plane.request(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
        if status == 200:
            return
        time.sleep(0.2)
    raise ControlPlaneError(f"namespace {namespace} got no default service account in 60 s")


def unsettled(plane: ControlPlane) -> list[str]:
    """Workload pods not yet Running and Ready (or done), and any pod still Pending."""
    found = []
    for pod in plane.call("GET", "/api/v1/pods")["items"]:
        metadata, status = pod["metadata"], pod.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            continue
        conditions = status.get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        if metadata.get("deletionTimestamp") or not ready:
            found.append(f"{metadata['namespace']}/{metadata['name']} {status.get('phase')}")
    return found


def settle(plane: ControlPlane, timeout: float = SETTLE_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while found := unsettled(plane):
        if time.monotonic() >= deadline:
            raise ControlPlaneError(f"the workloads did not settle in {timeout:g} s: {found[:8]}")
        time.sleep(0.5)


@dataclass
class KwokCluster:
    """A real control plane with KWOK GPU nodes and the simulated cluster's workloads: what
    the end-to-end stack needs where it would otherwise run a `SimCluster`."""

    plane: ControlPlane
    machines: list[Machine]
    gpus: int
    extra_kubeconfigs: dict[str, Path] = field(default_factory=dict)

    @property
    def node_names(self) -> list[str]:
        return [machine.name for machine in self.machines]

    def machine(self, node: str) -> Machine:
        for machine in self.machines:
            if machine.name == node:
                return machine
        raise KeyError(f"no KWOK machine {node!r}")

    def write_kubeconfig(self, path: Path) -> Path:
        return self.plane.write_kubeconfig(path)

    @staticmethod
    def start(plane: ControlPlane, nodes: int, gpus: int, *, seed: int = 0) -> KwokCluster:
        fleet = make_machines(nodes, gpus, seed=seed)
        register(plane, fleet, gpus)
        wait_schedulable(plane, [machine.name for machine in fleet])
        install_workloads(plane, nodes, gpus)
        settle(plane)
        return KwokCluster(plane, fleet, gpus)


# The chart, installed for real.

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gpuop"
RELEASE, RELEASE_NAMESPACE = "gpuop", "gpuop-system"


def helm(plane: ControlPlane, *arguments: str, timeout: float = 180) -> str:
    """Run the real Helm against `plane` as its admin; its output, or an error with it."""
    command = [str(binary("helm")), *arguments, "--kubeconfig", str(plane.admin_kubeconfig)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise ControlPlaneError(
            f"helm {' '.join(arguments)} exited {done.returncode}:\n{done.stderr}"
        )
    return done.stdout


def kubectl(
    plane: ControlPlane, *arguments: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The real kubectl against `plane` as its admin (its result, whatever the exit code)."""
    command = [str(binary("kubectl")), "--kubeconfig", str(plane.admin_kubeconfig), *arguments]
    return subprocess.run(
        command, input=stdin, capture_output=True, text=True, timeout=120, check=False
    )


def install_chart(plane: ControlPlane, *values: str) -> str:
    """`helm install` the chart into `RELEASE_NAMESPACE` (`values`: --set style
    assignments); the manifest Helm applied."""
    settings = [argument for value in values for argument in ("--set", value)]
    helm(
        plane, "install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE,
        "--create-namespace", *settings,
    )  # fmt: skip
    return helm(plane, "get", "manifest", RELEASE, "--namespace", RELEASE_NAMESPACE)


def service_account(role: str) -> str:
    """The chart's ServiceAccount of `role` (e.g. "upgrade-orchestrator")."""
    return f"{RELEASE}-{role}"


def service_account_kubeconfig(plane: ControlPlane, role: str, path: Path) -> Path:
    """A kubeconfig that acts as the chart's ServiceAccount of `role`, with a token from the
    TokenRequest API (an hour long, the apiserver's audience), as a pod would mount it."""
    name = service_account(role)
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    answer = plane.call(
        "POST", f"/api/v1/namespaces/{RELEASE_NAMESPACE}/serviceaccounts/{name}/token", request
    )
    user = f"system:serviceaccount:{RELEASE_NAMESPACE}:{name}"
    return plane.write_token_kubeconfig(path, user, answer["status"]["token"])


def allowed(
    plane: ControlPlane, role: str, verb: str, resource: str, namespace: str = "", name: str = ""
) -> bool:
    """What the real authorizer answers for the chart's ServiceAccount of `role` doing `verb`
    on `resource` ("pods", "pods/eviction", "leases.coordination.k8s.io"), through a
    SubjectAccessReview."""
    plural, _, group = resource.partition(".")
    plural, _, subresource = plural.partition("/")
    attributes = {"verb": verb, "resource": plural, "group": group, "subresource": subresource}
    attributes.update({"namespace": namespace, "name": name})
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{RELEASE_NAMESPACE}:{service_account(role)}",
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{RELEASE_NAMESPACE}",
                "system:authenticated",
            ],
            "resourceAttributes": attributes,
        },
    }
    answer = plane.call("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    return bool(answer["status"].get("allowed"))
