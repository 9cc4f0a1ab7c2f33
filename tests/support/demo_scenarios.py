"""Fakes of the cluster the demo scenarios act on (`gpuop_sim.cli.scenarios`): a Kubernetes
client that lists a node's pods and reads pods and nodes, a kubelet whose device plugin
advertises (or never does), GPU pods, and a `Stage` over them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from gpuop.kube.errors import NotFound
from gpuop_sim.cli.scenarios import Stage


def pod(name: str, node: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "metadata": {"namespace": "ml", "name": name},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "resources": {"limits": limits}}],
        },
        "status": {"phase": phase},
    }


class FakeKube:
    """Lists the pods of a node by its field selector, reads pods and nodes."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.nodes: dict[str, dict[str, Any]] = {}
        self.core = self

    def list_pod_for_all_namespaces(self) -> None: ...

    def read_namespaced_pod(self) -> None: ...

    def read_node(self) -> None: ...

    async def call(self, method: Any, *args: str, field_selector: str = "") -> dict[str, Any]:
        if method == self.read_node:
            return self.nodes[args[0]]
        if method == self.read_namespaced_pod:
            name, namespace = args
            for found in self.pods:
                if (found["metadata"]["namespace"], found["metadata"]["name"]) == (namespace, name):
                    return found
            raise NotFound(f"pods {name!r} not found")
        node = field_selector.removeprefix("spec.nodeName=")
        return {"items": [p for p in self.pods if p["spec"]["nodeName"] == node]}


@dataclass
class Device:
    ID: str
    health: str = "Healthy"


@dataclass
class FakeKubelet:
    devices: list[Device] | None
    """None: the plugin never advertises."""
    allocated: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    async def wait_for_devices(
        self, resource: str, check: Callable[[tuple[Device, ...]], bool], *, timeout: float
    ) -> tuple[Device, ...]:
        if self.devices is None or not check(tuple(self.devices)):
            raise TimeoutError
        return tuple(self.devices)

    async def allocate(self, resource: str, ids: list[str], *, pod: str, namespace: str) -> None:
        self.allocated.append((f"{namespace}/{pod}", tuple(ids)))


@dataclass
class FakeCluster:
    node_names: list[str]


def stage(pods: list[dict[str, Any]], kubelets: dict[str, FakeKubelet] | None = None) -> Stage:
    nodes = sorted(
        {p["spec"]["nodeName"] for p in pods} | {"gpu-node-1", "gpu-node-2", "gpu-node-3"}
    )
    return Stage(
        kube=cast(Any, FakeKube(pods)),
        cluster=cast(Any, FakeCluster(nodes)),
        roots={n: Path("/nonexistent") for n in nodes},
        kubelets=cast(Any, kubelets or {}),
        gpus=4,
    )
