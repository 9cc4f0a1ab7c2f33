"""gpuop already installed in the cluster `gpuop demo --kubeconfig` runs on (as `make
cluster` installs the chart): the demo runs services of its own, so for its duration it sets
the installed ones aside, and puts everything back when it ends.

- The installed cluster roles (every Deployment running `gpuop run <service>` with
  `GPUOP_ROLE=cluster`: the upgrade orchestrator, discovery's, the network-manager's and
  telemetry's) are scaled to zero replicas, then back to their own count: two orchestrators
  would each roll the demo's policy over the same nodes.
- The nodes already in the cluster (a real node, other KWOK nodes) are labelled
  `nvidia.com/gpu-driver-upgrade.skip=true`, which the demo's orchestrator leaves alone;
  the label is removed again from those it was added to.

The installed node agents and NATS keep running: they never act without their cluster roles.
Each step is said in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from kubernetes.aio import client as k8s

from gpuop.kube import client as kubeclient
from gpuop.kube import errors as kubeerrors

SKIP_LABEL = "nvidia.com/gpu-driver-upgrade.skip"
"""`gpuop.saga.admission.SKIP_LABELS`'s for the GPU driver."""
SCALE_TIMEOUT = 120.0


def cluster_roles(deployments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Deployments among `deployments` that run one of gpuop's cluster roles."""
    found = []
    for deployment in deployments:
        containers = deployment["spec"]["template"]["spec"].get("containers") or []
        for container in containers:
            environment = {e["name"]: e.get("value") for e in container.get("env") or []}
            if (container.get("args") or [""])[0] == "run" and environment.get(
                "GPUOP_ROLE"
            ) == "cluster":
                found.append(deployment)
                break
    return found


@contextlib.asynccontextmanager
async def set_aside(kube: kubeclient.Kube, say: Callable[[str], None]) -> AsyncIterator[None]:
    """The installed cluster roles paused and the nodes there now skipped, until the end."""
    apps = k8s.AppsV1Api(kube.api_client)
    listed = await kube.call(apps.list_deployment_for_all_namespaces)
    paused: list[tuple[str, str, int]] = []
    skipped: list[str] = []
    try:
        for deployment in cluster_roles(listed.get("items") or []):
            meta = deployment["metadata"]
            replicas = int(deployment["spec"].get("replicas", 1))
            if replicas == 0:
                continue
            await _scale(kube, apps, meta["namespace"], meta["name"], 0)
            paused.append((meta["namespace"], meta["name"], replicas))
        if paused:
            names = ", ".join(f"{namespace}/{name}" for namespace, name, _ in paused)
            say(
                f"gpuop demo: gpuop is installed here; its cluster roles ({names}) are paused "
                "while the demo's own run, and scaled back at the end"
            )
            await _until_stopped(kube, apps, paused)
        nodes = await kube.call(kube.core.list_node)
        for node in nodes.get("items") or []:
            name = node["metadata"]["name"]
            if (node["metadata"].get("labels") or {}).get(SKIP_LABEL) == "true":
                continue
            await _label(kube, name, "true")
            skipped.append(name)
        if skipped:
            say(
                f"gpuop demo: the nodes already here ({', '.join(skipped)}) carry "
                f"{SKIP_LABEL}=true until the end: the demo upgrades its own nodes only"
            )
        yield
    finally:
        for name in skipped:
            with contextlib.suppress(kubeerrors.KubeError):
                await _label(kube, name, None)
        for namespace, name, replicas in paused:
            with contextlib.suppress(kubeerrors.KubeError):
                await _scale(kube, apps, namespace, name, replicas)


async def _scale(kube: kubeclient.Kube, apps: Any, namespace: str, name: str, count: int) -> None:
    await kube.call(
        apps.patch_namespaced_deployment_scale, name, namespace, {"spec": {"replicas": count}}
    )


async def _until_stopped(
    kube: kubeclient.Kube, apps: Any, paused: list[tuple[str, str, int]]
) -> None:
    """Until no pod of the paused Deployments is left (an orchestrator ending its lease)."""
    deadline = asyncio.get_running_loop().time() + SCALE_TIMEOUT
    for namespace, name, _ in paused:
        while asyncio.get_running_loop().time() < deadline:
            current = await kube.call(apps.read_namespaced_deployment, name, namespace)
            if not (current.get("status") or {}).get("replicas"):
                break
            await asyncio.sleep(0.5)


async def _label(kube: kubeclient.Kube, node: str, value: str | None) -> None:
    await kube.call(kube.core.patch_node, node, {"metadata": {"labels": {SKIP_LABEL: value}}})
