"""The real control plane (`tests.support.control_plane`) furnished: KWOK GPU nodes with
the simulated cluster's workloads (`gpuop_sim.cluster.kwok`, which `gpuop demo
--kubeconfig` uses too), the chart installed by the real Helm, its ServiceAccounts' tokens,
and the real authorizer's answers for them."""

from __future__ import annotations

import asyncio
import concurrent.futures
import subprocess
from pathlib import Path

from gpuop.kube import client as kubeclient
from gpuop_sim.cluster.kwok import KwokFleet
from tests.support.control_plane import ControlPlane, ControlPlaneError, binary


def create_nodes(
    plane: ControlPlane, count: int, gpus: int, *, seed: int = 0, workloads: bool = True
) -> list[str]:
    """Register `count` KWOK GPU nodes named gpu-node-<n> with the simulated cluster's
    workloads (`gpuop_sim.cluster.kwok.KwokFleet`; not with `workloads` False, as `make
    cluster` leaves them to `gpuop demo`), blocking: in a thread of its own, so a fixture may
    call it from inside a running event loop too. They stay until the plane stops."""

    async def create() -> list[str]:
        async with await kubeclient.connect(plane.admin_kubeconfig) as kube:
            made = KwokFleet(kube, count, gpus, prefix="gpu-node-", seed=seed)
            await made.create(workloads=workloads)
            return made.node_names

    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, create()).result()


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
    return kubectl_as(plane.admin_kubeconfig, *arguments, stdin=stdin)


def kubectl_as(
    kubeconfig: Path, *arguments: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The real kubectl as whoever `kubeconfig` names (its result, whatever the exit code)."""
    command = [str(binary("kubectl")), "--kubeconfig", str(kubeconfig), *arguments]
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
