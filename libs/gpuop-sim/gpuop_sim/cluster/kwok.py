"""GPU nodes for an existing cluster, played by KWOK: what `gpuop demo --kubeconfig FILE`
runs on instead of the simulated cluster.

:class:`KwokFleet` registers one Node per machine (as its kubelet would, with the GPU
Operator's labels and the annotation ``kwok.x-k8s.io/node: fake`` that KWOK's usual
``--manage-nodes-with-annotation-selector`` picks up), waits until KWOK reports each Ready
and the node lifecycle controller lifts the not-ready taint, then creates the simulated
cluster's workloads (``workloads.manifests``) for the real scheduler and controllers to run.
On exit it deletes what it made: the policy's nodes and the workload namespaces, and nothing
it found there before. A node of the same name that already exists is an error, not reused.
The workloads' pods go to KWOK's nodes only (labelled ``kwok.x-k8s.io/node: fake`` too): a
cluster may have real nodes beside them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from datetime import UTC, datetime
from typing import Any

from gpuop import lifecycles
from gpuop.kube import client as kubeclient
from gpuop.kube import errors as kubeerrors
from gpuop_sim.cluster import machines, workloads
from gpuop_sim.cluster.machines import Machine

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
READY_TIMEOUT = 90.0
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


class FleetError(RuntimeError):
    """The cluster could not take the fleet; the message says what to do."""


class KwokFleet(lifecycles.Closable):
    """``nodes`` KWOK GPU nodes of ``gpus`` GPUs, named ``<prefix><n>``, in the cluster
    ``kube`` reaches; ``async with KwokFleet(kube, 3, 8) as fleet``."""

    def __init__(
        self,
        kube: kubeclient.Kube,
        nodes: int,
        gpus: int,
        *,
        prefix: str = "gpuop-demo-",
        seed: int = 0,
        ready_timeout: float = READY_TIMEOUT,
    ) -> None:
        self.kube = kube
        self.gpus = gpus
        self.ready_timeout = ready_timeout
        rng = random.Random(seed)
        kind = machines.machine_type(gpus)
        self.machines = [
            Machine.create(f"{prefix}{index}", index, kind, rng) for index in range(1, nodes + 1)
        ]
        self._made_nodes: list[str] = []
        self._made_namespaces: list[str] = []

    @property
    def node_names(self) -> list[str]:
        return [machine.name for machine in self.machines]

    def machine(self, node: str) -> Machine:
        for machine in self.machines:
            if machine.name == node:
                return machine
        raise KeyError(f"no KWOK machine {node!r}")

    async def __aenter__(self) -> KwokFleet:
        try:
            await self.create()
        except BaseException:
            await self.remove()
            raise
        return self

    async def create(self, *, settle: bool = True, workloads: bool = True) -> None:
        """Register the nodes, wait until they are schedulable, make the workloads (unless
        not `workloads`: nodes alone) and (with `settle`) wait until their pods run. `remove`
        takes them away again."""
        await self._register()
        await self._wait_ready()
        if not workloads:
            return
        await self._install_workloads()
        if settle:
            await self._settle()

    async def close(self) -> None:
        await self.remove()

    async def _register(self) -> None:
        now = datetime.now(UTC)
        for machine in self.machines:
            node = machines.node_object(machine, now)
            node["metadata"]["annotations"][KWOK_ANNOTATION] = "fake"
            node["metadata"]["labels"][KWOK_ANNOTATION] = "fake"  # the workloads' selector
            node["metadata"]["labels"].update(workloads.GPU_NODE_LABELS)
            try:
                await self.kube.call(self.kube.core.create_node, node)
            except kubeerrors.AlreadyExists:
                raise FleetError(
                    f"node {machine.name} already exists: the demo registers nodes of its own "
                    "(delete it, or it is left from an earlier demo that was killed)"
                ) from None
            self._made_nodes.append(machine.name)

    async def _wait_ready(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout
        pending = self.node_names
        while pending:
            if loop.time() > deadline:
                raise FleetError(
                    f"nodes {', '.join(pending)} not Ready within {self.ready_timeout:g} s: is "
                    f"KWOK running on this cluster, managing nodes annotated {KWOK_ANNOTATION}"
                    "=fake (or all nodes), and a kube-controller-manager to lift their "
                    f"{NOT_READY_TAINT} taint?"
                )
            await asyncio.sleep(0.5)
            found = [await self.kube.call(self.kube.core.read_node, name) for name in pending]
            pending = [node["metadata"]["name"] for node in found if not _schedulable(node)]

    async def _install_workloads(self) -> None:
        made = workloads.manifests(len(self.machines), self.gpus, job_seconds=600)
        for resource, namespace, obj in made:
            body = {"apiVersion": resource.api_version, "kind": resource.kind, **obj}
            if resource.kind == "Namespace":
                name = obj["metadata"]["name"]
                try:
                    await self.kube.call(self.kube.core.create_namespace, body)
                except kubeerrors.AlreadyExists:
                    raise FleetError(
                        f"namespace {name} already exists: the demo makes its workloads in "
                        "namespaces of its own"
                    ) from None
                self._made_namespaces.append(name)
                await self._wait_service_account(name)
                continue
            _on_fake_nodes(body)
            await self._create(resource.group, resource.version, resource.plural, namespace, body)

    async def _create(
        self, group: str, version: str, plural: str, namespace: str, body: dict[str, Any]
    ) -> None:
        """Create through the generic custom-objects calls, which serve any API group (every
        workload kind but Namespace has one)."""
        await self.kube.call(
            self.kube.custom_objects.create_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            body,
        )

    async def _wait_service_account(self, namespace: str) -> None:
        """The ServiceAccount admission plugin refuses pods until the controller made one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout
        while True:
            try:
                await self.kube.call(
                    self.kube.core.read_namespaced_service_account, "default", namespace
                )
                return
            except kubeerrors.NotFound:
                if loop.time() > deadline:
                    raise FleetError(
                        f"namespace {namespace} got no default ServiceAccount: is a "
                        "kube-controller-manager running?"
                    ) from None
                await asyncio.sleep(0.2)

    async def _settle(self) -> None:
        """Until every pod of the workloads is Running and Ready (or done)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout
        while True:
            waiting = []
            for namespace in self._made_namespaces:
                pods = await self.kube.call(self.kube.core.list_namespaced_pod, namespace)
                waiting += [
                    f"{namespace}/{pod['metadata']['name']}"
                    for pod in pods.get("items") or []
                    if not _running(pod)
                ]
            if not waiting:
                return
            if loop.time() > deadline:
                raise FleetError(
                    f"the workloads' pods did not run within {self.ready_timeout:g} s: "
                    f"{', '.join(waiting[:5])} (is a kube-scheduler running?)"
                )
            await asyncio.sleep(0.5)

    async def remove(self) -> None:
        """Delete the nodes and namespaces this fleet made (their pods go with them)."""
        for name in self._made_namespaces:
            with contextlib.suppress(kubeerrors.NotFound):
                await self.kube.call(self.kube.core.delete_namespace, name)
        for name in self._made_nodes:
            with contextlib.suppress(kubeerrors.NotFound):
                await self.kube.call(self.kube.core.delete_node, name)
        self._made_namespaces.clear()
        self._made_nodes.clear()


def _on_fake_nodes(obj: dict[str, Any]) -> None:
    """A workload's pods only on KWOK's nodes: a cluster may have real nodes too (`make
    cluster`'s), where the images of the simulated workloads exist nowhere."""
    spec = obj.get("spec") or {}
    template = spec.get("template") or (spec.get("jobTemplate") or {}).get("spec", {}).get(
        "template"
    )
    pod = template.get("spec") if template else (spec if "containers" in spec else None)
    if pod is not None:
        pod.setdefault("nodeSelector", {})[KWOK_ANNOTATION] = "fake"


def _running(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return ready and not pod["metadata"].get("deletionTimestamp")


def _schedulable(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    taints = (node.get("spec") or {}).get("taints") or []
    return ready and not any(t.get("key") == NOT_READY_TAINT for t in taints)
