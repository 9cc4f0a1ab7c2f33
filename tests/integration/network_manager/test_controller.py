"""The cluster role on the simulated API server: one NetworkAttachmentDefinition per
network, updated when the network changes, deleted when it goes; the section published for
the node roles once per change; a wrong section or a foreign attachment changes nothing."""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio import client as k8s

from gpuop.bus import Buckets, InMemoryBus
from gpuop.kube import client, customobjects, errors
from gpuop.policy import PublishedNetwork, crd, specs
from gpuop.policy.networks import CONFIG_KEY
from gpuop.services.network_manager import attachments, blocks
from gpuop.services.network_manager.config import NetworkManagerConfig
from gpuop.services.network_manager.controller import NetworkController
from gpuop_sim import ApiServer
from gpuop_sim.apiserver.crds import network_attachment_definitions
from tests.support.networks import wire

NADS = customobjects.NETWORK_ATTACHMENT_DEFINITIONS
POLICIES = customobjects.GPU_CLUSTER_POLICIES
QUICK = NetworkManagerConfig(retry_interval_seconds=0.05)


def policy_spec(*networks: dict[str, Any], **rest: Any) -> dict[str, Any]:
    return {
        "driver": {"gpu": {"version": "580.105.08"}},
        "network": {"networks": list(networks)},
        **rest,
    }


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[client.Kube]:
    async with (
        ApiServer(bookmark_interval=0.2) as server,
        await client.connect(server.write_kubeconfig(tmp_path / "kubeconfig")) as kube,
    ):
        extensions = k8s.ApiextensionsV1Api(kube.api_client)
        for definition in (crd.build(), network_attachment_definitions()):
            await kube.call(extensions.create_custom_resource_definition, definition)
        await kube.call(kube.core.create_namespace, {"metadata": {"name": "training"}})
        yield kube


async def apply_policy(kube: client.Kube, spec: dict[str, Any]) -> None:
    body = {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": "default"},
        "spec": spec,
    }
    try:
        await customobjects.create(kube, POLICIES, body)
    except errors.AlreadyExists:
        await kube.call(
            kube.custom_objects.patch_cluster_custom_object,
            specs.GROUP,
            specs.VERSION,
            specs.PLURAL,
            "default",
            {"spec": spec},
            _content_type="application/merge-patch+json",
        )


async def attachments_by_name(kube: client.Kube) -> dict[str, dict[str, Any]]:
    items = await customobjects.list_objects(kube, NADS)
    return {f"{i['metadata']['namespace']}/{i['metadata']['name']}": i for i in items}


async def published(bus: InMemoryBus) -> tuple[int, PublishedNetwork] | None:
    entry = await (await bus.kv(Buckets.CONFIG)).get(CONFIG_KEY)
    if entry is None:
        return None
    return entry.revision, PublishedNetwork.model_validate_json(entry.value)


async def test_each_network_gets_one_attachment_and_the_nodes_get_the_section(
    kube: client.Kube, bus: InMemoryBus
) -> None:
    await apply_policy(
        kube,
        policy_spec(
            wire(mtu=9000), wire("roce-b", namespace="training", resourceName="rdma/roce_shared")
        ),
    )
    controller = NetworkController(bus, kube, QUICK)

    await controller.reconcile()

    found = await attachments_by_name(kube)
    assert sorted(found) == ["default/roce-a", "training/roce-b"]
    config = json.loads(found["default/roce-a"]["spec"]["config"])
    assert (config["type"], config["master"], config["mtu"]) == ("macvlan", "gpuop-roce-a", 9000)
    roce_b = found["training/roce-b"]["metadata"]
    assert roce_b["annotations"]["k8s.v1.cni.cncf.io/resourceName"] == "rdma/roce_shared"
    assert roce_b["labels"][attachments.NETWORK_LABEL] == "roce-b"
    stored = await published(bus)
    assert stored is not None
    assert [n.name for n in stored[1].spec.networks] == ["roce-a", "roce-b"]
    assert stored[1].policy == "default"


async def test_a_second_pass_writes_nothing(kube: client.Kube, bus: InMemoryBus) -> None:
    await apply_policy(kube, policy_spec(wire()))
    controller = NetworkController(bus, kube, QUICK)
    await controller.reconcile()
    before = await attachments_by_name(kube)
    first = await published(bus)

    await controller.reconcile()

    assert await attachments_by_name(kube) == before
    assert await published(bus) == first


async def test_a_changed_network_updates_its_attachment_and_a_removed_one_deletes_it(
    kube: client.Kube, bus: InMemoryBus
) -> None:
    controller = NetworkController(bus, kube, QUICK)
    await apply_policy(kube, policy_spec(wire(resourceName="rdma/roce_shared"), wire("roce-b")))
    await controller.reconcile()
    uid = (await attachments_by_name(kube))["default/roce-a"]["metadata"]["uid"]

    await apply_policy(kube, policy_spec(wire(mtu=4200)))
    await controller.reconcile()

    found = await attachments_by_name(kube)
    assert sorted(found) == ["default/roce-a"]
    assert found["default/roce-a"]["metadata"]["uid"] == uid
    assert json.loads(found["default/roce-a"]["spec"]["config"])["mtu"] == 4200
    assert "k8s.v1.cni.cncf.io/resourceName" not in found["default/roce-a"]["metadata"].get(
        "annotations", {}
    )


async def test_an_attachment_someone_else_made_is_left_alone(
    kube: client.Kube, bus: InMemoryBus
) -> None:
    theirs = {
        "apiVersion": NADS.api_version,
        "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "roce-a", "namespace": "default"},
        "spec": {"config": '{"type": "host-device"}'},
    }
    await customobjects.create(kube, NADS, theirs)
    await apply_policy(kube, policy_spec(wire(), wire("roce-b", namespace="missing")))

    await NetworkController(bus, kube, QUICK).reconcile()

    found = await attachments_by_name(kube)
    assert sorted(found) == ["default/roce-a"]
    assert found["default/roce-a"]["spec"]["config"] == '{"type": "host-device"}'


async def test_an_invalid_network_section_changes_nothing(
    kube: client.Kube, bus: InMemoryBus
) -> None:
    controller = NetworkController(bus, kube, QUICK)
    await apply_policy(kube, policy_spec(wire()))
    await controller.reconcile()
    before, first = await attachments_by_name(kube), await published(bus)

    bad = wire(mtu=1400, ipam={"cidr": "192.168.100.7/24"})
    await apply_policy(kube, policy_spec(bad))
    result = await controller.reconcile()

    assert result is None
    assert await attachments_by_name(kube) == before
    assert await published(bus) == first


async def test_a_mistake_outside_the_network_section_does_not_hold_networks_back(
    kube: client.Kube, bus: InMemoryBus
) -> None:
    # the API server's schema cannot see this one; the orchestrator's validation does
    retry = {"backoffSeconds": 600, "maxBackoffSeconds": 60}
    await apply_policy(kube, policy_spec(wire(), upgradePolicy={"retry": retry}))

    await NetworkController(bus, kube, QUICK).reconcile()

    assert sorted(await attachments_by_name(kube)) == ["default/roce-a"]


async def test_without_a_policy_the_nodes_are_told_there_are_no_networks(
    kube: client.Kube, bus: InMemoryBus
) -> None:
    controller = NetworkController(bus, kube, QUICK)
    await apply_policy(kube, policy_spec(wire()))
    await controller.reconcile()

    await kube.call(
        kube.custom_objects.delete_cluster_custom_object,
        specs.GROUP,
        specs.VERSION,
        specs.PLURAL,
        "default",
    )
    await controller.reconcile()

    assert await attachments_by_name(kube) == {}
    stored = await published(bus)
    assert stored is not None and stored[1] == PublishedNetwork()


async def test_the_running_controller_follows_policy_changes(
    kube: client.Kube, bus: InMemoryBus
) -> None:
    controller = NetworkController(bus, kube, NetworkManagerConfig(resync_interval_seconds=3600))
    stopping = asyncio.Event()
    task = asyncio.create_task(controller.run(stopping))
    try:
        await apply_policy(kube, policy_spec(wire()))
        async with asyncio.timeout(10):
            while "default/roce-a" not in await attachments_by_name(kube):
                await asyncio.sleep(0.02)
        await apply_policy(kube, policy_spec(wire("roce-b")))
        async with asyncio.timeout(10):
            while sorted(await attachments_by_name(kube)) != ["default/roce-b"]:
                await asyncio.sleep(0.02)
    finally:
        stopping.set()
        await asyncio.wait_for(task, 10)


async def test_without_multus_the_nodes_still_get_their_networks(
    tmp_path: Path, bus: InMemoryBus
) -> None:
    async with (
        ApiServer(bookmark_interval=0.2) as server,
        await client.connect(server.write_kubeconfig(tmp_path / "kubeconfig")) as kube,
    ):
        controller = NetworkController(bus, kube, QUICK)
        assert await controller.reconcile() == PublishedNetwork()  # no policy CRD: no policy
        extensions = k8s.ApiextensionsV1Api(kube.api_client)
        await kube.call(extensions.create_custom_resource_definition, crd.build())
        await apply_policy(kube, policy_spec(wire()))

        result = await controller.reconcile()

    assert result is not None and [n.name for n in result.spec.networks] == ["roce-a"]
    stored = await published(bus)
    assert stored is not None and stored[1] == result


async def test_the_nodes_of_the_selector_get_blocks_and_a_deleted_one_gives_its_back(
    kube: client.Kube, bus: InMemoryBus
) -> None:
    for name, labels in (("gpu-1", {"nic": "cx7"}), ("gpu-2", {"nic": "cx7"}), ("cp-1", {})):
        await kube.call(kube.core.create_node, {"metadata": {"name": name, "labels": labels}})
    ipam = {"cidr": "10.10.0.0/24", "rangeStart": "10.10.0.10", "perNodeBlockSize": 8}
    await apply_policy(kube, policy_spec(wire(ipam=ipam)))
    controller = NetworkController(
        bus, kube, QUICK.model_copy(update={"block_node_selector": "nic=cx7"})
    )
    kv = await bus.kv(Buckets.IPAM)
    subnet = ipaddress.ip_network("10.10.0.0/24")

    await controller.reconcile()

    cut = await blocks.read(kv, subnet)
    assert {b.node: str(b) for b in cut.blocks} == {
        "gpu-1": "10.10.0.10-10.10.0.17",
        "gpu-2": "10.10.0.18-10.10.0.25",
    }
    await kube.call(kube.core.delete_node, "gpu-1")
    await controller.reconcile()
    assert [b.node for b in (await blocks.read(kv, subnet)).blocks] == ["gpu-2"]
