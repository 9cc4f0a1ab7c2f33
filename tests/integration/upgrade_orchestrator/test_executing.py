"""The orchestrator's Kubernetes actions on the simulated cluster, through the official
client: each reports its outcome with the action's id, and a repeat reports the same; with
a copy of the node and the node's shared pod informer they read nothing more; the pod
deletion removes the pods holding the window's devices (GPU, RDMA, DRA claims) and no
other."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuop.events import dra
from gpuop.events import kube as observed
from gpuop.events.driver import Component
from gpuop.events.upgrade import UpgradeState
from gpuop.inventory import claims
from gpuop.kube import client, nodes, pods
from gpuop.kube.recording import EventRecorder
from gpuop.saga import actions
from gpuop.saga.upgrade import records
from gpuop.services.upgrade_orchestrator import executing
from gpuop.services.upgrade_orchestrator.executing import KubeExecutor
from gpuop.services.upgrade_orchestrator.nodepods import NodePods
from gpuop_sim import ApiServer, RequestKind, SimCluster
from tests.support import kube_objects as kube_support
from tests.support.sagas import BOOT_A, GPU_NEW, GPU_OLD, OFED_NEW, OFED_OLD, T0, Run, policy


@pytest.fixture
async def cluster() -> AsyncIterator[SimCluster]:
    async with SimCluster(nodes=2, gpus=2, workloads=True, seed=3) as running:
        await running.settle()
        yield running


@pytest.fixture
async def kube(cluster: SimCluster, tmp_path: Path) -> AsyncIterator[client.Kube]:
    async with await client.connect(cluster.write_kubeconfig(tmp_path / "kubeconfig")) as api:
        yield api


async def test_a_repeated_cordon_reports_the_node_as_it_was_before_the_first(
    cluster: SimCluster, kube: client.Kube
) -> None:
    first, second = cluster.node_names
    executor = KubeExecutor(kube, EventRecorder(kube))
    await kube.call(kube.core.patch_node, second, {"spec": {"unschedulable": True}})

    outcomes = [
        await executor.execute(node, actions.Cordon(id=f"cordon-{node}"))
        for node in (first, first, second, second)
    ]

    assert [o.was_unschedulable for o in outcomes if isinstance(o, observed.NodeCordoned)] == [
        False,
        False,
        True,
        True,
    ]
    assert [o.action_id for o in outcomes if isinstance(o, observed.KubeActionResult)] == [
        f"cordon-{first}",
        f"cordon-{first}",
        f"cordon-{second}",
        f"cordon-{second}",
    ]
    uncordoned = await executor.execute(first, actions.Uncordon(id="uncordon"))
    assert isinstance(uncordoned, observed.NodeUncordoned)
    assert not nodes.is_unschedulable(await nodes.get(kube, first))


async def test_deleting_gpu_pods_then_draining_empties_the_node(
    cluster: SimCluster, kube: client.Kube
) -> None:
    node = cluster.node_names[0]
    executor = KubeExecutor(kube, EventRecorder(kube))
    await executor.execute(node, actions.Cordon(id="cordon"))
    assert await pods.gpu_pods_on(kube, node), "the seeded cluster runs GPU pods on the node"

    deleted = await executor.execute(
        node,
        actions.DeletePods(
            id="delete", components=(Component.GPU,), force=True, timeout_seconds=30,
            delete_empty_dir=True,
        ),
    )  # fmt: skip
    drained = await executor.execute(
        node,
        actions.Drain(
            id="drain", force=True, pod_selector="", timeout_seconds=30, delete_empty_dir=True
        ),
    )

    assert isinstance(deleted, observed.PodsDeleted) and deleted.deleted > 0, deleted
    assert isinstance(drained, observed.DrainCompleted), drained
    assert await pods.gpu_pods_on(kube, node) == []


def served_since(cluster: SimCluster, before: Counter[RequestKind]) -> Counter[RequestKind]:
    served = Counter(cluster.requests)
    served.subtract(before)
    return +served


async def test_a_cordon_from_a_known_node_writes_the_state_label_in_its_one_request(
    cluster: SimCluster, kube: client.Kube
) -> None:
    node = cluster.node_names[0]
    watched = await nodes.get(kube, node)  # as the controller's node watch holds it
    executor = KubeExecutor(kube, EventRecorder(kube), watched_node={node: watched}.get)
    before = Counter(cluster.requests)

    cordon = actions.Cordon(id="cordon", label=UpgradeState.CORDON_REQUIRED)
    cordoned = await executor.execute(node, cordon)
    started = actions.RecordEvent(id="e", reason="r", message="m", warning=False)
    await executor.execute(node, started)  # the node's uid from the same copy

    assert isinstance(cordoned, observed.NodeCordoned) and not cordoned.was_unschedulable
    assert served_since(cluster, before) == {
        RequestKind("PATCH", "nodes", "resource"): 1,
        RequestKind("POST", "events", "namespace"): 1,
    }
    written = await nodes.get(kube, node)
    assert nodes.is_unschedulable(written)
    assert nodes.labels_of(written)[actions.STATE_LABEL] == "cordon-required"


async def test_pod_deletion_and_drain_share_one_list_and_watch_of_the_nodes_pods(
    cluster: SimCluster, kube: client.Kube
) -> None:
    node = cluster.node_names[0]
    shared = NodePods(kube)
    shared.hold([node])  # as the controller holds it while the saga is in those steps
    executor = KubeExecutor(kube, EventRecorder(kube), node_pods=shared)
    await executor.execute(node, actions.Cordon(id="cordon"))
    before = Counter(cluster.requests)

    deleted = await executor.execute(
        node,
        actions.DeletePods(
            id="delete", components=(Component.GPU,), force=True, timeout_seconds=30,
            delete_empty_dir=True,
        ),
    )  # fmt: skip
    # the selector is applied to the shared informer's pods, not by the server
    drained = await executor.execute(
        node,
        actions.Drain(
            id="drain", force=True, pod_selector="app=metrics-gateway", timeout_seconds=30,
            delete_empty_dir=True,
        ),
    )  # fmt: skip
    shared.hold([])
    await shared.close()

    assert isinstance(deleted, observed.PodsDeleted) and deleted.deleted > 0, deleted
    assert isinstance(drained, observed.DrainCompleted) and drained.evicted == 1, drained
    served = served_since(cluster, before)
    assert served[RequestKind("LIST", "pods", "cluster")] == 1
    assert served[RequestKind("WATCH", "pods", "cluster")] == 1
    left = [pod["metadata"]["labels"].get("app") for pod in await pods.on_node(kube, node)]
    assert "metrics-gateway" not in left and "nvidia-driver-daemonset" in left


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[ApiServer, client.Kube]]:
    """A bare API server with node-1 (deleted pods are gone at once) and a client."""
    async with ApiServer(kubelet_delay=0.0) as server:
        server.seed(kube_support.node("node-1"))
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        async with await client.connect(kubeconfig) as kube:
            yield server, kube


def window_of(*components: Component) -> Run:
    """A saga whose window upgrades `components` (the node runs the others' versions)."""
    spec = policy(ofed=True)
    running: dict[Component, str | None] = {
        Component.GPU: GPU_OLD if Component.GPU in components else GPU_NEW,
        Component.OFED: OFED_OLD if Component.OFED in components else OFED_NEW,
    }
    saga = records.new_saga(
        node="node-1", rollout_id="r", policy=spec, running=running, now=T0, boot_id=BOOT_A
    )
    return Run(spec, saga)


async def delete_window_pods(
    kube: client.Kube, run: Run, node_claims: claims.NodeClaims | None = None
) -> observed.KubeEvent | None:
    """Drive `run` to its pod deletion and execute it on the node."""
    run.admit()
    run.until(UpgradeState.POD_DELETION_REQUIRED)
    (deletion,) = [a for a in run.kube_actions() if isinstance(a, actions.DeletePods)]
    executor = KubeExecutor(kube, EventRecorder(kube), claims=node_claims)
    return await executor.execute("node-1", deletion)


async def left(kube: client.Kube) -> list[str]:
    return sorted(pod["metadata"]["name"] for pod in await pods.on_node(kube, "node-1"))


RDMA = kube_support.gpus(1, "rdma/rdma_shared_device_a")


async def test_an_ofed_window_evicts_an_rdma_pod_before_the_ofed_unload(
    api: tuple[ApiServer, client.Kube],
) -> None:
    server, kube = api
    server.seed(kube_support.pod("roce-job", resources=RDMA))
    server.seed(kube_support.pod("train", resources=kube_support.gpus()))
    run = window_of(Component.OFED)

    deleted = await delete_window_pods(kube, run)

    assert isinstance(deleted, observed.PodsDeleted) and deleted.deleted == 1, deleted
    assert await left(kube) == ["train"]  # the GPU driver stays: so does its pod
    run.feed(deleted)
    run.until(UpgradeState.VALIDATION_REQUIRED)
    work = run.work()
    assert work.index("deletepods") < work.index("unload:ofed")
    assert "unload:gpu" not in work


async def test_a_gpu_window_leaves_a_pod_holding_only_rdma_running(
    api: tuple[ApiServer, client.Kube],
) -> None:
    server, kube = api
    server.seed(kube_support.pod("roce-job", resources=RDMA))
    server.seed(kube_support.pod("train", resources=kube_support.gpus()))

    deleted = await delete_window_pods(kube, window_of(Component.GPU))

    assert isinstance(deleted, observed.PodsDeleted) and deleted.deleted == 1, deleted
    assert await left(kube) == ["roce-job"]


async def test_a_window_of_both_drivers_deletes_the_pods_of_both(
    api: tuple[ApiServer, client.Kube],
) -> None:
    server, kube = api
    server.seed(kube_support.pod("roce-job", resources=RDMA))
    server.seed(kube_support.pod("train", resources=kube_support.gpus()))
    server.seed(kube_support.pod("web"))

    deleted = await delete_window_pods(kube, window_of(Component.GPU, Component.OFED))

    assert isinstance(deleted, observed.PodsDeleted) and deleted.deleted == 2, deleted
    assert await left(kube) == ["web"]


async def test_a_pod_with_a_dra_claim_on_nvidias_gpu_driver_is_deleted_in_a_gpu_window(
    api: tuple[ApiServer, client.Kube],
) -> None:
    server, kube = api
    server.seed(kube_support.claim("gpus", "gpu.nvidia.com"))
    server.seed(kube_support.claim("nics", "dra.example.com"))
    server.seed(kube_support.with_claims(kube_support.pod("dra-train"), made={"g": "gpus"}))
    server.seed(kube_support.with_claims(kube_support.pod("dra-nic"), named={"n": "nics"}))

    deleted = await delete_window_pods(kube, window_of(Component.GPU))

    assert isinstance(deleted, observed.PodsDeleted) and deleted.deleted == 1, deleted
    assert await left(kube) == ["dra-nic"]


async def test_a_gpu_window_deletes_the_pods_of_any_drivers_claims_on_the_nodes_gpus(
    api: tuple[ApiServer, client.Kube],
) -> None:
    """Another DRA driver's device the device plugin's cluster role matched to a GPU of the
    node (`dra.ClaimAllocated`): its claimant goes before the GPU driver's unload."""
    server, kube = api
    server.seed(kube_support.claim("vgpu", "gpu.example.com"))
    server.seed(kube_support.with_claims(kube_support.pod("vgpu-job"), named={"g": "vgpu"}))
    server.seed(kube_support.pod("web"))
    node_claims = claims.NodeClaims()
    node_claims.apply("node-1", dra.ClaimAllocated(
        claim=dra.ClaimRef(namespace="default", name="vgpu", uid="0001"),
        devices=(dra.AllocatedDevice(
            request="device", driver="gpu.example.com", pool="node-1", device="dev-0",
            gpu_uuid="GPU-20bce083-dbf9-2d4f-3c35-c858915accc5",
        ),),
        pods=(dra.PodRef(namespace="default", name="vgpu-job", uid="0002"),),
        resource_version="3",
    ))  # fmt: skip
    node_claims.ready.set()

    deleted = await delete_window_pods(kube, window_of(Component.GPU), node_claims)

    assert isinstance(deleted, observed.PodsDeleted) and deleted.deleted == 1, deleted
    assert await left(kube) == ["web"]


async def test_a_claims_read_that_never_finishes_does_not_hold_the_pod_deletion(
    api: tuple[ApiServer, client.Kube], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log's claim facts never read (a reader whose consumer name an orphaned one holds,
    seen after a NATS server was killed): the deletion goes on after its bounded wait with
    the claims it knows, NVIDIA's drivers' holders still found from the API server."""
    server, kube = api
    server.seed(kube_support.claim("gpus", "gpu.nvidia.com"))
    server.seed(kube_support.with_claims(kube_support.pod("dra-train"), named={"g": "gpus"}))
    server.seed(kube_support.pod("web"))
    monkeypatch.setattr(executing, "CLAIMS_READ_WAIT_SECONDS", 0.2)

    never_read = claims.NodeClaims()
    deleted = await delete_window_pods(kube, window_of(Component.GPU), never_read)

    assert isinstance(deleted, observed.PodsDeleted) and deleted.deleted == 1, deleted
    assert await left(kube) == ["web"]
