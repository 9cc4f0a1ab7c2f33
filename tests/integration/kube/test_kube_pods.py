"""GPU pod selection, the pods a driver's window deletes (resources and DRA claims), pods on
a node with pod selectors, and deleting one incarnation."""

from __future__ import annotations

import pytest

from gpuop.events.driver import Component
from gpuop.kube import client, pods
from gpuop.kube.pods import PodRef
from gpuop_sim import ApiServer
from tests.support import kube_objects as support


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (support.pod("whole", resources=support.gpus(2)), {"nvidia.com/gpu"}),
        (
            support.pod("shared", resources=support.gpus(1, "nvidia.com/gpu.shared")),
            {"nvidia.com/gpu.shared"},
        ),
        (
            support.pod("mig", resources=support.gpus(1, "nvidia.com/mig-1g.18gb")),
            {"nvidia.com/mig-1g.18gb"},
        ),
        (
            support.pod("limits-only", resources={"limits": {"nvidia.com/gpu": "1"}}),
            {"nvidia.com/gpu"},
        ),
        (
            support.pod("init", init_resources={"requests": {"nvidia.com/gpu": "1"}}),
            {"nvidia.com/gpu"},
        ),
        (support.pod("cpu", resources={"requests": {"cpu": "2"}}), set()),
        (support.pod("nic", resources=support.gpus(1, "nvidia.com/rdma_shared")), set()),
    ],
    ids=["whole", "shared", "mig", "limits-only", "init-container", "cpu", "rdma"],
)
def test_gpu_resources_come_from_requests_or_limits_of_any_container(
    pod: dict[str, object], expected: set[str]
) -> None:
    assert pods.gpu_resources(pod) == expected


def test_only_running_or_pending_pods_hold_gpus() -> None:
    for phase, holds in (("Running", True), ("Pending", True), ("Succeeded", False)):
        pod = support.pod("p", resources=support.gpus(), phase=phase)
        assert pods.uses_gpu(pod) is holds


async def test_pods_on_a_node_use_the_node_name_field_selector(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.pod("here", node="node-1"))
    server.seed(support.pod("also-here", node="node-1", namespace="kube-system"))
    server.seed(support.pod("elsewhere", node="node-2"))

    found = await pods.on_node(kube, "node-1")
    in_default = await pods.on_node(kube, "node-1", namespace="default")

    assert [str(PodRef.of(pod)) for pod in found] == ["default/here", "kube-system/also-here"]
    assert [pod["metadata"]["name"] for pod in in_default] == ["here"]
    assert "fieldSelector=spec.nodeName%3Dnode-1" in server.request_log[-1].query


async def test_gpu_pods_on_a_node_narrowed_by_a_pod_selector(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.pod("train", resources=support.gpus(), labels={"team": "ml"}))
    server.seed(support.pod("infer", resources=support.gpus(), labels={"team": "web"}))
    server.seed(support.pod("web", labels={"team": "web"}))
    server.seed(support.pod("done", resources=support.gpus(), phase="Succeeded"))
    server.seed(support.pod("other-node", node="node-2", resources=support.gpus()))

    every = await pods.gpu_pods_on(kube, "node-1")
    ml = await pods.gpu_pods_on(kube, "node-1", label_selector="team=ml")

    assert [pod["metadata"]["name"] for pod in every] == ["infer", "train"]
    assert [pod["metadata"]["name"] for pod in ml] == ["train"]


async def test_delete_removes_the_pod_it_names(server: ApiServer, kube: client.Kube) -> None:
    ref = PodRef.of(server.seed(support.pod("p", node=None)))

    assert await pods.delete(kube, ref) is True
    assert await pods.on_node(kube, "node-1") == []
    assert await pods.delete(kube, ref) is False  # already gone


async def test_delete_never_removes_a_successor_with_the_same_name(
    server: ApiServer, kube: client.Kube
) -> None:
    old = PodRef.of(server.seed(support.pod("p")))
    await kube.call(kube.core.delete_namespaced_pod, "p", "default", grace_period_seconds=0)
    successor = PodRef.of(server.seed(support.pod("p")))

    assert await pods.delete(kube, old) is False

    [still] = await pods.on_node(kube, "node-1")
    assert PodRef.of(still) == successor


@pytest.mark.parametrize("kubelet_delay", [None])
async def test_delete_with_a_grace_period_leaves_the_pod_terminating(
    server: ApiServer, kube: client.Kube
) -> None:
    ref = PodRef.of(server.seed(support.pod("p")))

    await pods.delete(kube, ref, grace_period_seconds=30)

    [pod] = await pods.on_node(kube, "node-1")
    assert pods.is_terminating(pod)
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 30
    server.complete_pod_termination("default", "p")
    assert await pods.on_node(kube, "node-1") == []


GPU, OFED = Component.GPU, Component.OFED
RDMA = support.gpus(1, "rdma/rdma_shared_device_a")


@pytest.mark.parametrize(
    ("resources", "gpu", "ofed"),
    [
        (support.gpus(), True, False),
        (support.gpus(1, "nvidia.com/mig-1g.18gb"), True, False),
        (RDMA, False, True),
        (support.gpus(1, "openshift.io/mlxnics"), False, True),
        (support.gpus(1, "intel.com/mlnx_sriov_rdma"), False, True),
        (support.gpus(1, "nvidia.com/hostdev"), False, False),  # ambiguous: left to the drain
        ({"requests": {"cpu": "2"}}, False, False),
    ],
    ids=["gpu", "mig", "rdma", "sriov-operator", "sriov-device-plugin", "nvidia-nic", "cpu"],
)
def test_which_pods_a_window_deletes_depends_on_its_components(
    resources: dict[str, object], gpu: bool, ofed: bool
) -> None:
    pod = support.pod("p", resources=resources)
    assert pods.holds(pod, [GPU]) is gpu
    assert pods.holds(pod, [OFED]) is ofed
    assert pods.holds(pod, [GPU, OFED]) is (gpu or ofed)
    assert not pods.holds(support.pod("done", resources=resources, phase="Succeeded"), [GPU, OFED])


def test_the_claims_a_pod_uses_are_named_or_made_from_a_template() -> None:
    pod = support.with_claims(
        support.pod("p"),
        named={"shared": "team-gpus"},
        made={"own": "p-own-x7k2q", "later": ""},  # "later": no claim made (yet)
    )
    assert pods.claims_of(pod) == (("default", "team-gpus"), ("default", "p-own-x7k2q"))
    assert pods.claims_of(support.pod("plain")) == ()


def test_a_claim_allocated_by_nvidias_dra_drivers_holds_gpus() -> None:
    pod = support.with_claims(support.pod("p"), named={"gpu": "c"})
    for driver, holds in (
        ("gpu.nvidia.com", True),
        ("compute-domain.nvidia.com", True),
        ("dra.example.com", False),
    ):
        drivers = {("default", "c"): pods.allocated_drivers(support.claim("c", driver))}
        assert pods.holds(pod, [GPU], drivers) is holds, driver
        assert not pods.holds(pod, [OFED], drivers)
    assert pods.allocated_drivers(support.claim("pending")) == frozenset()


async def test_the_holders_filter_reads_each_claim_once_and_only_when_pods_use_one(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.claim("gpus", "gpu.nvidia.com"))
    server.seed(support.claim("nics", "dra.example.com"))
    trainer = support.with_claims(support.pod("trainer"), named={"g": "gpus"})
    also = support.with_claims(support.pod("also"), made={"g": "gpus"})
    nic = support.with_claims(support.pod("nic"), named={"n": "nics"})
    gone = support.with_claims(support.pod("gone"), named={"g": "deleted-claim"})
    listed = [trainer, also, nic, gone, support.pod("web")]
    before = len(server.request_log)

    accept = await pods.holders_filter(kube, [GPU], listed)

    assert [p["metadata"]["name"] for p in listed if accept(p)] == ["trainer", "also"]
    reads = [r.path for r in server.request_log[before:]]
    assert sorted(reads) == [
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/deleted-claim",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/gpus",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/nics",
    ]
    before = len(server.request_log)
    await pods.holders_filter(kube, [OFED], listed)  # no DRA driver of the OFED's to look for
    await pods.holders_filter(kube, [GPU], [support.pod("web")])
    assert server.request_log[before:] == []


async def test_pods_reserving_another_drivers_claim_on_the_nodes_gpus_hold_a_gpu(
    server: ApiServer, kube: client.Kube
) -> None:
    """The device plugin's cluster role matched the other driver's device to one of the
    node's GPUs (`dra.ClaimAllocated`): its claimants go with the GPU's driver, not the
    OFED's, and not once they finished."""
    server.seed(support.claim("vgpu", "gpu.example.com"))
    claimant = support.with_claims(support.pod("claimant"), named={"g": "vgpu"})
    finished = support.with_claims(support.pod("finished", phase="Succeeded"), named={"g": "vgpu"})
    listed = [claimant, finished, support.pod("web")]
    matched = {("default", "claimant"), ("default", "finished")}

    accept = await pods.holders_filter(kube, [GPU], listed, matched)
    assert [p["metadata"]["name"] for p in listed if accept(p)] == ["claimant"]
    unmatched = await pods.holders_filter(kube, [GPU], listed)
    assert [p["metadata"]["name"] for p in listed if unmatched(p)] == []
    ofed = await pods.holders_filter(kube, [OFED], listed, matched)
    assert [p["metadata"]["name"] for p in listed if ofed(p)] == []
