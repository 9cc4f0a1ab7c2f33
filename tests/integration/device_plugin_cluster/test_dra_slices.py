"""The cluster role writes each DRA node's ResourceSlices from its inventory: published while
the node's plugin serves DRA, updated with a higher generation when the inventory changes,
made again after the kubelet wipes them, deleted when the node stops serving DRA or leaves;
every write decided again on a conflict."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from gpuop.bus import InMemoryBus
from gpuop.events.device_api_commands import DeviceApi
from gpuop.events.dra import DRIVER
from gpuop.kube import client, dra
from gpuop.services.device_plugin.cluster import slices as slices_module
from gpuop.services.device_plugin.cluster.slices import SlicePublisher
from tests.integration.device_plugin_cluster.conftest import (
    NODE,
    Running,
    add_node,
    dra_node,
    eventually,
    send,
    serving,
)
from tests.support.inventories import H200, inventory


async def pool(kube: client.Kube, node: str = NODE) -> list[dict[str, Any]]:
    return await dra.list_slices(kube, driver=DRIVER, node=node)


async def generation_of(kube: client.Kube, node: str = NODE) -> int:
    found = await pool(kube, node)
    return int(found[0]["spec"]["pool"]["generation"]) if found else 0


async def test_a_dra_node_gets_its_pool_and_a_device_plugin_node_none(
    bus: InMemoryBus, kube: client.Kube, running: Running
) -> None:
    uid = await dra_node(bus, kube)
    await add_node(kube, "node-2")
    await send(bus, inventory(), node="node-2")
    await send(bus, serving(DeviceApi.DEVICE_PLUGIN), node="node-2")

    async with running():
        await eventually(lambda: _has_slices(kube))

    [published] = await pool(kube)
    spec = published["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == (DRIVER, NODE, NODE)
    assert spec["pool"]["resourceSliceCount"] == 1
    [device] = spec["devices"]
    assert device["name"] == "gpu-0"
    assert device["attributes"]["uuid"] == {"string": H200.uuid}
    assert device["capacity"]["memory"] == {"value": "143771Mi"}
    owner = published["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", NODE, uid)
    assert await pool(kube, "node-2") == []


@asynccontextmanager
async def published_pool(running: Running, kube: client.Kube) -> AsyncIterator[int]:
    """The role running with the pool of `serving_node` published; its generation."""
    async with running():
        await eventually(lambda: _has_slices(kube))
        yield await generation_of(kube)


async def _has_slices(kube: client.Kube, node: str = NODE) -> bool:
    return bool(await pool(kube, node))


async def test_a_driver_upgrade_raises_the_generation_and_changes_the_version(
    bus: InMemoryBus, kube: client.Kube, running: Running, serving_node: str
) -> None:
    async with published_pool(running, kube) as first:
        await send(bus, inventory(driver_version="590.10.01"))

        async def upgraded() -> bool:
            found = await pool(kube)
            attributes = found[0]["spec"]["devices"][0]["attributes"]
            return attributes["driverVersion"] == {"version": "590.10.1"}

        await eventually(upgraded)
    assert await generation_of(kube) == first + 1


async def test_slices_the_kubelet_wiped_are_made_again_with_a_higher_generation(
    bus: InMemoryBus, kube: client.Kube, running: Running, serving_node: str
) -> None:
    async with published_pool(running, kube) as first:
        await kube.call(
            kube.resource.delete_collection_resource_slice,
            field_selector=f"spec.nodeName={NODE}",
        )

        await eventually(lambda: _has_slices(kube))
        assert await generation_of(kube) > first


async def test_an_edited_slice_is_put_back(
    bus: InMemoryBus, kube: client.Kube, running: Running, serving_node: str
) -> None:
    async with published_pool(running, kube):
        [published] = await pool(kube)
        published["spec"]["devices"] = []
        await dra.replace_slice(kube, published)

        async def restored() -> bool:
            found = await pool(kube)
            return bool(found and found[0]["spec"]["devices"])

        await eventually(restored)


async def test_slices_go_when_the_node_stops_serving_dra(
    bus: InMemoryBus, kube: client.Kube, running: Running, serving_node: str
) -> None:
    async with published_pool(running, kube):
        await send(bus, serving(on=False))

        async def gone() -> bool:
            return not await _has_slices(kube)

        await eventually(gone)


async def test_a_node_that_left_keeps_no_slices(kube: client.Kube) -> None:
    publisher = await synced(kube)
    assert await _has_slices(kube)

    await kube.call(kube.core.delete_node, NODE)
    await publisher.sync(NODE)
    assert not await _has_slices(kube)

    uid = await add_node(kube)  # a new Node under the name: the slices' new owner
    await publisher.sync(NODE)
    [published] = await pool(kube)
    assert published["metadata"]["ownerReferences"][0]["uid"] == uid


async def test_a_replace_decided_on_a_stale_read_is_decided_again(
    kube: client.Kube, monkeypatch: Any
) -> None:
    publisher = await synced(kube)
    stale = await pool(kube)
    # another writer changes the slice after the read the next sync decides on
    [changed] = await pool(kube)
    changed["spec"]["devices"] = []
    await dra.replace_slice(kube, changed)
    reads = 0
    fresh_list = dra.list_slices

    async def first_read_stale(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        nonlocal reads
        reads += 1
        return stale if reads == 1 else await fresh_list(*args, **kwargs)

    monkeypatch.setattr(slices_module.dra, "list_slices", first_read_stale)
    publisher.inventory(NODE, inventory(driver_version="590.10.01"), _now())

    await publisher.sync(NODE)

    assert reads == 2
    [published] = await pool(kube)
    [device] = published["spec"]["devices"]
    assert device["attributes"]["driverVersion"] == {"version": "590.10.1"}


async def test_an_older_answer_does_not_replace_a_newer_one(kube: client.Kube) -> None:
    publisher = SlicePublisher(kube)
    later = _now()
    earlier = later.replace(year=later.year - 1)

    assert publisher.api_applied(NODE, serving(on=False), later)
    assert not publisher.api_applied(NODE, serving(), earlier)
    assert not publisher.state(NODE).serves_dra


async def synced(kube: client.Kube) -> SlicePublisher:
    """A publisher that wrote the pool of a DRA node once."""
    publisher = SlicePublisher(kube)
    await add_node(kube)
    publisher.inventory(NODE, inventory(), _now())
    publisher.api_applied(NODE, serving(), _now())
    await publisher.sync(NODE)
    return publisher


def _now():  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    return datetime.now(UTC)
