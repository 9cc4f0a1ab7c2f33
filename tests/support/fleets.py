"""A whole rollout of the real orchestrator over the simulated cluster, with fake node agents:
what `test_api_requests.py` bounds and `tests/bench/scale.py` measures.

`rollout` starts a `SimCluster` (GPU workloads under PodDisruptionBudgets, a training Job),
installs the GPUClusterPolicy CRD and a policy that waits for the Job's pods, deletes GPU
pods and drains, puts each node's inventory in KV as discovery would, and answers every
driver and operand command on the in-memory bus at once, as healthy node agents do. The
orchestrator runs as in the service, `leading.lead` with the Lease, through the official
client. It returns once every node is upgrade-done, with the API requests the server
served from the orchestrator's start until then (`SimCluster.requests`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes.aio import client as k8s

from gpuop.bus import Buckets, ConsumerSpec, Delivery, InMemoryBus
from gpuop.events import new_event, subjects
from gpuop.events.upgrade import UpgradeState
from gpuop.kube import client
from gpuop.kube import errors as kube_errors
from gpuop.policy import crd, specs
from gpuop.services.upgrade_orchestrator import leading
from gpuop.services.upgrade_orchestrator.config import OrchestratorConfig
from gpuop.services.upgrade_orchestrator.store import SagaStore
from gpuop_sim import RequestKind, RequestRecord, SimCluster
from gpuop_sim.cluster.kwok import KwokFleet
from tests.support import fleet as kwok_fleet
from tests.support.control_plane import ControlPlane
from tests.support.orchestrator import answers
from tests.support.sagas import inventory, policy

REPO = Path(__file__).resolve().parents[2]
AGENT_SOURCE = "/gpuop/fake-node-agent"
JOB_SELECTOR = "app=finetune"
"""The simulated cluster's training Job, which the policy waits for."""


@dataclass(frozen=True)
class Rollout:
    """What one rollout cost."""

    upgraded: int
    """Nodes that reached upgrade-done."""
    seconds: float
    requests: Counter[RequestKind]
    """Requests served from the orchestrator's start until the last node was done."""
    log: list[RequestRecord]
    """The same requests, as they came."""

    @property
    def unfiltered_pod_lists(self) -> int:
        """LISTs and WATCHes of pods in every namespace not narrowed to one node."""
        return sum(
            record.method == "GET"
            and record.path == "/api/v1/pods"
            and "spec.nodeName" not in _unquoted(record.query)
            for record in self.log
        )


def _unquoted(query: str) -> str:
    return query.replace("%3D", "=").replace("%3d", "=")


def policy_object(max_parallel: int) -> dict[str, Any]:
    """The GPUClusterPolicy of the rollout: wait for the Job, delete GPU pods, drain."""
    spec = policy(
        max_parallel_upgrades=max_parallel,
        max_unavailable="25%",
        wait_for_completion={"pod_selector": JOB_SELECTOR, "timeout_seconds": 120},
        pod_deletion={"force": True, "delete_empty_dir": True, "timeout_seconds": 60},
        drain={"enable": True, "force": True, "delete_empty_dir": True, "timeout_seconds": 60},
    )
    return {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": "default"},
        "spec": spec.to_wire(),
    }


async def _answer(bus: InMemoryBus, delivery: Delivery) -> None:
    for event in answers(delivery.payload, delivery.envelope.id):
        await bus.publish(
            new_event(event, node=delivery.envelope.node, source=AGENT_SOURCE,
                      causationid=delivery.envelope.id)
        )  # fmt: skip


async def _done(store: SagaStore) -> int:
    return sum(e.saga.state is UpgradeState.UPGRADE_DONE for e in await store.all())


async def rollout(
    tmp: Path,
    *,
    nodes: int,
    gpus: int = 8,
    max_parallel: int = 0,
    job_seconds: float = 3.0,
    timeout: float = 120.0,
    config: OrchestratorConfig | None = None,
) -> Rollout:
    """Roll a GPU driver upgrade across a simulated cluster of `nodes` (see the module
    docstring); `max_parallel` 0 means a quarter of the nodes at once."""
    config = config or OrchestratorConfig()
    max_parallel = max_parallel or max(1, nodes // 4)
    async with SimCluster(nodes=nodes, gpus=gpus, seed=5, job_seconds=job_seconds) as cluster:
        kube = await client.connect(cluster.write_kubeconfig(tmp / "kubeconfig"))
        try:
            boot_ids = {node: cluster.boot_id(node) for node in cluster.node_names}
            await _install_policy(kube, policy_object(max_parallel))
            await cluster.settle()
            before, logged = Counter(cluster.requests), len(cluster.server.request_log)
            seconds = await _drive(kube, boot_ids, config, timeout)
            requests = Counter(cluster.requests)
            requests.subtract(before)
            log = cluster.server.request_log[logged:]
        finally:
            await kube.close()
    return Rollout(nodes, seconds, +requests, log)


async def rollout_on_plane(
    tmp: Path,
    plane: ControlPlane,
    *,
    nodes: int,
    gpus: int = 8,
    max_parallel: int = 0,
    timeout: float = 180.0,
) -> tuple[float, Counter[tuple[str, str]]]:
    """The same rollout on the real control plane: KWOK GPU nodes with the same workloads,
    the chart's RBAC, and the orchestrator acting as its chart ServiceAccount, so the
    apiserver's audit log tells its requests from everyone else's. The policy does not wait
    for the training Job (KWOK's Job pods run on and on); the seconds, and the requests by
    (verb, resource[/subresource]) from the audit log."""
    max_parallel = max_parallel or max(1, nodes // 4)
    admin = await client.connect(plane.write_kubeconfig(tmp / "admin.kubeconfig"))
    try:
        made = KwokFleet(admin, nodes, gpus, prefix="gpu-node-", seed=5)
        await made.create()
        boot_ids = {node: made.machine(node).boot_id for node in made.node_names}
        await asyncio.to_thread(kwok_fleet.install_chart, plane)
        spec = policy_object(max_parallel)
        spec["spec"]["upgradePolicy"].pop("waitForCompletion", None)
        await _install_policy(admin, spec, exists_ok=True)
    finally:
        await admin.close()
    path = kwok_fleet.service_account_kubeconfig(
        plane, "upgrade-orchestrator", tmp / "orchestrator.kubeconfig"
    )
    kube = await client.connect(path)
    config = OrchestratorConfig(lease_namespace=kwok_fleet.RELEASE_NAMESPACE)
    try:
        seconds = await _drive(kube, boot_ids, config, timeout)
    finally:
        await kube.close()
    user = f"system:serviceaccount:{kwok_fleet.RELEASE_NAMESPACE}:gpuop-upgrade-orchestrator"
    requests: Counter[tuple[str, str]] = Counter()
    for event in plane.audit_events():
        if event["user"]["username"] == user:
            ref = event.get("objectRef") or {}
            sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
            requests[(event["verb"], ref.get("resource", "") + sub)] += 1
    return seconds, requests


async def _install_policy(
    kube: client.Kube, policy_body: dict[str, Any], *, exists_ok: bool = False
) -> None:
    definition = yaml.safe_load((REPO / crd.COMMITTED).read_text(encoding="utf-8"))
    extensions = k8s.ApiextensionsV1Api(kube.api_client)
    try:
        await kube.call(extensions.create_custom_resource_definition, definition)
    except kube_errors.AlreadyExists:
        if not exists_ok:
            raise
    for _ in range(100):  # a real apiserver serves a new CRD a moment after creating it
        try:
            await kube.call(
                kube.custom_objects.create_cluster_custom_object,
                specs.GROUP, specs.VERSION, specs.PLURAL, policy_body,
            )  # fmt: skip
            return
        except kube_errors.NotFound:
            await asyncio.sleep(0.1)
    raise RuntimeError("the GPUClusterPolicy CRD was never served")


async def _drive(
    kube: client.Kube, boot_ids: dict[str, str], config: OrchestratorConfig, timeout: float
) -> float:
    """The orchestrator (`leading.lead`) on an in-memory bus with fake node agents, until
    every node in `boot_ids` is upgrade-done; the seconds it took."""
    bus = InMemoryBus()
    await bus.start()
    stopping = asyncio.Event()
    agents = await bus.consume(
        ConsumerSpec(
            durable="fake-node-agents",
            subjects=(subjects.stream_filter(subjects.Kind.COMMAND),),
        ),
        lambda delivery: _answer(bus, delivery),
    )
    lead: asyncio.Task[None] | None = None
    try:
        inventories = await bus.kv(Buckets.NODES)
        for node, boot_id in boot_ids.items():
            found = inventory(boot_id)
            await inventories.put(subjects.encode_node(node), found.model_dump_json().encode())
        began = time.perf_counter()
        lead = asyncio.create_task(
            leading.lead(bus, kube, config, stopping, identity="scale"), name="orchestrator"
        )
        store = await SagaStore.open(bus)
        async with asyncio.timeout(timeout):
            while await _done(store) < len(boot_ids):
                if lead.done():
                    lead.result()
                    raise RuntimeError("the orchestrator stopped before the rollout ended")
                await asyncio.sleep(0.1)
        return time.perf_counter() - began
    finally:
        stopping.set()
        if lead is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(lead, 10)
        await agents.stop()
        await bus.close()
