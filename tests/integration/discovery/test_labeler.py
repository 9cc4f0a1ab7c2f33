"""Discovery's cluster role against the simulated API server, through `gpuop.kube`: labels
appear, stale gpuop labels go, user labels stay, unknown nodes are retried."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gpuop.bus import Buckets, InMemoryBus, KeyValue, TemporaryError
from gpuop.clocks import VirtualClock
from gpuop.events import subjects
from gpuop.inventory.labeling import LabelSettings
from gpuop.kube import client, nodes
from gpuop.kube.recording import EventRecorder
from gpuop.services.discovery import labeler
from gpuop.services.discovery.labeler import HASH_ANNOTATION, OWNED_ANNOTATION, Labeler
from gpuop_sim import ApiServer
from tests.support.discovered import NODE, inventory, labels_on, node_object


@pytest.fixture
async def inventories() -> AsyncIterator[KeyValue]:
    bus = InMemoryBus()
    await bus.start()
    yield await bus.kv(Buckets.NODES)
    await bus.close()


@pytest.fixture
def subject(kube: client.Kube, inventories: KeyValue) -> Labeler:
    recorder = EventRecorder(kube, instance="discovery-0", clock=VirtualClock())
    return Labeler(kube, inventories, LabelSettings(), recorder=recorder, retry_delay=2.0)


def patches(server: ApiServer) -> int:
    return sum(
        1
        for record in server.request_log
        if record.method == "PATCH" and record.path == f"/api/v1/nodes/{NODE}"
    )


async def test_the_inventory_labels_appear_on_the_node_with_a_record_of_them(
    server: ApiServer, kube: client.Kube, subject: Labeler
) -> None:
    server.seed(node_object())
    discovered = inventory(gpus=8)

    change = await subject.apply(NODE, discovered)

    node = await nodes.get(kube, NODE)
    labels = nodes.labels_of(node)
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert labels["nvidia.com/gpu.memory"] == "143771"
    assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"
    assert labels["feature.node.kubernetes.io/system-os_release.ID"] == "ubuntu"
    annotations = nodes.annotations_of(node)
    assert set(annotations[OWNED_ANNOTATION].split(",")) == set(labels)
    assert annotations[HASH_ANNOTATION] == discovered.inventory_hash
    assert dict(change.written) == labels
    events = await kube.call(kube.core.list_namespaced_event, "default")
    [event] = events["items"]
    assert event["reason"] == labeler.EVENT_REASON
    assert event["involvedObject"]["name"] == NODE
    assert event["message"].startswith(f"set {len(labels)} labels, removed 0; ")
    assert "nvidia.com/gpu.count=8, nvidia.com/gpu.product=NVIDIA-H200" in event["message"]


async def test_the_same_inventory_again_patches_nothing(
    server: ApiServer, subject: Labeler
) -> None:
    server.seed(node_object())
    discovered = inventory()
    await subject.apply(NODE, discovered)
    before = patches(server)

    change = await subject.apply(NODE, discovered)

    assert not change
    assert patches(server) == before


async def test_labels_gpuop_set_that_no_longer_hold_are_removed(
    server: ApiServer, kube: client.Kube, subject: Labeler
) -> None:
    server.seed(node_object())
    await subject.apply(NODE, inventory())

    change = await subject.apply(NODE, inventory(os_id=None, os_version_id=None))

    labels = await labels_on(kube)
    assert not any(key.startswith("feature.node.kubernetes.io/system-os_release") for key in labels)
    assert "feature.node.kubernetes.io/system-os_release.ID" in change.removed
    assert labels["nvidia.com/gpu.count"] == "1"


async def test_user_labels_are_never_removed(
    server: ApiServer, kube: client.Kube, subject: Labeler
) -> None:
    user = {
        "team": "ml",
        "nvidia.com/mig.config": "all-1g.18gb",
        "feature.node.kubernetes.io/custom-rdma.available": "true",
    }
    server.seed(node_object(labels=user))
    await subject.apply(NODE, inventory())
    await subject.apply(NODE, inventory(gpus=0))  # driver unloaded
    await subject.apply(NODE, inventory(os_id=None, os_version_id=None))

    labels = await labels_on(kube)
    assert {key: labels.get(key) for key in user} == user
    assert "nvidia.com/mig.config" not in nodes.annotations_of(await nodes.get(kube, NODE))[
        OWNED_ANNOTATION
    ].split(",")


async def test_gpu_labels_stay_while_the_driver_is_unloaded(
    server: ApiServer, kube: client.Kube, subject: Labeler
) -> None:
    server.seed(node_object())
    await subject.apply(NODE, inventory(gpus=8))

    await subject.apply(NODE, inventory(gpus=0))
    while_unloaded = await labels_on(kube)
    await subject.apply(NODE, inventory(gpus=8, driver_version="590.10.01"))
    reloaded = await labels_on(kube)

    assert while_unloaded["nvidia.com/gpu.count"] == "8"
    assert while_unloaded["nvidia.com/cuda.driver-version.full"] == "580.159.04"
    assert reloaded["nvidia.com/cuda.driver-version.full"] == "590.10.01"
    assert reloaded["nvidia.com/cuda.driver-version.major"] == "590"


async def test_a_node_that_is_not_registered_yet_is_retried_later(subject: Labeler) -> None:
    with pytest.raises(TemporaryError, match="not registered") as raised:
        await subject.apply(NODE, inventory())

    assert raised.value.delay == 2.0


async def test_a_heartbeat_naming_a_missed_inventory_applies_the_stored_one(
    server: ApiServer, kube: client.Kube, subject: Labeler, inventories: KeyValue
) -> None:
    server.seed(node_object())
    missed = inventory(gpus=4)
    await inventories.put(subjects.encode_node(NODE), missed.model_dump_json().encode())

    await subject.catch_up(NODE, "f" * 64)  # not what is stored: nothing to apply yet
    assert "nvidia.com/gpu.count" not in await labels_on(kube)
    await subject.catch_up(NODE, missed.inventory_hash)
    before = patches(server)
    await subject.catch_up(NODE, missed.inventory_hash)  # applied: not even read again

    assert (await labels_on(kube))["nvidia.com/gpu.count"] == "4"
    assert patches(server) == before
