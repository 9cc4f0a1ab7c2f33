"""Helpers for the simulated cluster suites: fast clusters, official clients, builders."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from kubernetes.aio import client, config

from gpuop_sim import SimCluster

Obj = dict[str, Any]
T = TypeVar("T")

FAST = {"start_delay": 0.02, "termination_cap": 0.05, "heartbeat_interval": 0.5}
"""Delays that keep a test of a drain or a reboot well under a second."""


@asynccontextmanager
async def running_cluster(
    nodes: int = 3, gpus: int = 8, **options: Any
) -> AsyncIterator[SimCluster]:
    async with SimCluster(nodes, gpus, **{"seed": 7, **FAST, **options}) as cluster:
        await cluster.settle()
        yield cluster


@asynccontextmanager
async def official_client(kubeconfig: Path) -> AsyncIterator[client.ApiClient]:
    """The official asyncio client, configured only from the kubeconfig file."""
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        yield api


def gpu_container(gpus: int) -> Obj:
    limits = {"nvidia.com/gpu": str(gpus)}
    return {
        "name": "main",
        "image": "nvcr.io/nvidia/cuda:12.6.0-base-ubuntu24.04",
        "resources": {"requests": limits, "limits": limits},
    }


def gpu_pod(name: str, gpus: int, **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"containers": [gpu_container(gpus)], **spec},
    }


def gpu_deployment(name: str, replicas: int, gpus: int) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [gpu_container(gpus)]},
            },
        },
    }


def ready_status(node: Any) -> str:
    return str(next(c.status for c in node.status.conditions if c.type == "Ready"))


def controller_kind(pod: Any) -> str | None:
    for reference in pod.metadata.owner_references or []:
        if reference.controller:
            return str(reference.kind)
    return None
