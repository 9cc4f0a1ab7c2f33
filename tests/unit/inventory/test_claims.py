"""The node's ResourceClaims folded from `dra.ClaimAllocated`/`ClaimReleased`: the newest
resourceVersion per claim wins, a release removes, devices of any driver count by their GPU,
and `follow` reads the log's facts before it says it is ready."""

from __future__ import annotations

import asyncio

from gpuop.bus import InMemoryBus
from gpuop.events import dra, new_event
from gpuop.inventory.claims import ClaimHolders, NodeClaims, follow, follow_all
from tests.support.node_agents import NODE
from tests.support.waiting import eventually

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-11111111-1111-1111-1111-111111111111"
UID_A = "aaaaaaaa-0000-0000-0000-000000000001"
UID_B = "bbbbbbbb-0000-0000-0000-000000000002"


def pod(name: str, uid: str = "") -> dra.PodRef:
    return dra.PodRef(namespace="ml", name=name, uid=uid or f"{len(name):08d}-0000-0000-0000-0")


def allocated(
    uid: str,
    version: int,
    *pods: dra.PodRef,
    gpu: str | None = GPU0,
    driver: str = dra.DRIVER,
    device: str = "gpu-0",
) -> dra.ClaimAllocated:
    return dra.ClaimAllocated(
        claim=dra.ClaimRef(namespace="ml", name=f"claim-{uid[:4]}", uid=uid),
        devices=(
            dra.AllocatedDevice(
                request="gpu", driver=driver, pool=NODE, device=device, gpu_uuid=gpu
            ),
        ),
        pods=pods,
        resource_version=str(version),
    )


def released(uid: str) -> dra.ClaimReleased:
    return dra.ClaimReleased(
        claim=dra.ClaimRef(namespace="ml", name=f"claim-{uid[:4]}", uid=uid), deleted=False
    )


def names(pods: tuple[dra.PodRef, ...]) -> list[str]:
    return [p.name for p in pods]


def test_the_newest_resource_version_of_a_claim_wins() -> None:
    claims = ClaimHolders()
    assert claims.apply(allocated(UID_A, 10, pod("first")))
    assert claims.apply(allocated(UID_A, 12, pod("second")))
    assert not claims.apply(allocated(UID_A, 11, pod("older")))  # redelivered, older

    assert names(claims.pods_holding([GPU0])) == ["second"]


def test_a_release_removes_the_claim_and_an_older_allocation_does_not_bring_it_back() -> None:
    claims = ClaimHolders()
    claims.apply(allocated(UID_A, 10, pod("trainer")))
    assert claims.apply(released(UID_A))
    assert not claims.apply(allocated(UID_A, 10, pod("trainer")))
    assert claims.pods_holding([GPU0]) == ()

    assert claims.apply(allocated(UID_A, 20, pod("again")))  # allocated anew: newer
    assert names(claims.pods_holding([GPU0])) == ["again"]


def test_only_the_pods_of_claims_on_the_gpus_asked_about_are_holders() -> None:
    claims = ClaimHolders()
    claims.apply(allocated(UID_A, 1, pod("on-zero")))
    claims.apply(allocated(UID_B, 1, pod("on-one"), gpu=GPU1, device="gpu-1"))

    assert names(claims.pods_holding([GPU0])) == ["on-zero"]
    assert names(claims.pods_holding([GPU1])) == ["on-one"]
    assert {gpu: names(p) for gpu, p in claims.pods_by_gpu().items()} == {
        GPU0: ["on-zero"],
        GPU1: ["on-one"],
    }


def test_another_drivers_device_counts_by_the_gpu_it_is() -> None:
    claims = ClaimHolders()
    claims.apply(allocated(UID_A, 1, pod("other"), driver="gpu.example.com", device="dev-7"))

    assert names(claims.pods_holding([GPU0])) == ["other"]


def test_a_device_matched_to_no_gpu_holds_every_gpu_but_labels_none() -> None:
    claims = ClaimHolders()
    claims.apply(allocated(UID_A, 1, pod("unknown"), gpu=None))

    assert names(claims.pods_holding([GPU1])) == ["unknown"]
    assert claims.pods_by_gpu() == {}


def test_an_allocation_no_pod_reserves_yet_holds_nothing() -> None:
    claims = ClaimHolders()
    claims.apply(allocated(UID_A, 1))

    assert claims.pods_holding([GPU0]) == ()
    assert claims.pods_by_gpu() == {}


async def publish(
    bus: InMemoryBus, payload: dra.ClaimAllocated | dra.ClaimReleased, node: str
) -> None:
    await bus.publish(new_event(payload, node=node, source="/gpuop/device-plugin-cluster"))


async def test_follow_applies_the_logs_facts_before_it_is_ready_then_each_new_one(
    bus: InMemoryBus,
) -> None:
    await publish(bus, allocated(UID_A, 1, pod("before")), NODE)
    await publish(bus, allocated(UID_B, 1, pod("elsewhere")), "gpu-2.example.com")
    claims = ClaimHolders()
    task = asyncio.create_task(follow(bus, NODE, claims, retry_seconds=0.01))
    try:
        await asyncio.wait_for(claims.ready.wait(), 5)
        assert names(claims.pods_holding([GPU0])) == ["before"]

        await publish(bus, released(UID_A), NODE)
        await eventually(lambda: claims.pods_holding([GPU0]) == ())
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert claims.pods_by_gpu() == {}  # the other node's claim was never read


async def test_follow_all_keeps_each_nodes_claimants_apart(bus: InMemoryBus) -> None:
    other = "gpu-2.example.com"
    await publish(bus, allocated(UID_A, 1, pod("here")), NODE)
    await publish(bus, allocated(UID_B, 1, pod("there")), other)
    claims = NodeClaims()
    task = asyncio.create_task(follow_all(bus, claims, retry_seconds=0.01))
    try:
        await asyncio.wait_for(claims.ready.wait(), 5)
        assert claims.claimants(NODE) == {("ml", "here")}
        assert claims.claimants(other) == {("ml", "there")}
        assert claims.claimants("gpu-3.example.com") == frozenset()

        await publish(bus, released(UID_B), other)
        await eventually(lambda: claims.claimants(other) == frozenset())
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert claims.claimants(NODE) == {("ml", "here")}
