"""`gpuop.kube.dra` against the simulated API server: slices listed per driver and node,
replaced and deleted only as they were read, watched; taint rules put once per device."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpuop.kube import dra, errors
from gpuop.kube.client import Kube

DRIVER = "gpu.nvidia.com"


def resource_slice(node: str, *, driver: str = DRIVER, generation: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-{driver}-"},
        "spec": {
            "driver": driver,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}],
        },
    }


async def test_slices_are_listed_by_driver_and_node(kube: Kube) -> None:
    mine = await dra.create_slice(kube, resource_slice("node-1"))
    await dra.create_slice(kube, resource_slice("node-2"))
    await dra.create_slice(kube, resource_slice("node-1", driver="other.example.com"))

    found = await dra.list_slices(kube, driver=DRIVER, node="node-1")

    assert [s["metadata"]["name"] for s in found] == [mine["metadata"]["name"]]
    assert len(await dra.list_slices(kube, driver=DRIVER)) == 2
    assert len(await dra.list_slices(kube, driver=DRIVER, pool="node-2")) == 1


async def test_a_replace_decided_on_an_old_read_conflicts(kube: Kube) -> None:
    created = await dra.create_slice(kube, resource_slice("node-1"))
    newer = dict(
        created, spec={**created["spec"], "pool": {**created["spec"]["pool"], "generation": 2}}
    )
    await dra.replace_slice(kube, newer)

    stale = dict(
        created, spec={**created["spec"], "pool": {**created["spec"]["pool"], "generation": 3}}
    )
    with pytest.raises(errors.Conflict):
        await dra.replace_slice(kube, stale)


async def test_a_delete_spares_a_slice_made_again_under_the_name(kube: Kube) -> None:
    body = resource_slice("node-1")
    body["metadata"] = {"name": "node-1-gpu"}
    first = await dra.create_slice(kube, body)
    assert await dra.delete_slice(kube, first) is True
    await dra.create_slice(kube, body)

    with pytest.raises(errors.Conflict):
        await dra.delete_slice(kube, first)
    assert len(await dra.list_slices(kube, driver=DRIVER)) == 1

    gone = await dra.list_slices(kube, driver=DRIVER)
    await dra.delete_slice(kube, gone[0])
    assert await dra.delete_slice(kube, gone[0]) is False


async def test_slices_are_watched_for_the_driver_only(kube: Kube) -> None:
    async with dra.watch_slices(kube, driver=DRIVER) as watch:
        events = aiter(watch)
        await dra.create_slice(kube, resource_slice("node-1", driver="other.example.com"))
        created = await dra.create_slice(kube, resource_slice("node-1"))
        event = await asyncio.wait_for(anext(events), 10)

    assert (event.type, event.object["metadata"]["name"]) == ("ADDED", created["metadata"]["name"])


async def test_a_taint_rule_is_put_once_per_device_and_replaced_when_it_differs(kube: Kube) -> None:
    rule = dra.taint_rule(driver=DRIVER, node="node-1", device="gpu-3", key="gpuop.io/quarantine")
    first = await dra.put_taint_rule(kube, rule)
    again = await dra.put_taint_rule(kube, rule)
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]

    executing = dra.taint_rule(
        driver=DRIVER, node="node-1", device="gpu-3", key="gpuop.io/quarantine", effect="NoExecute"
    )
    replaced = await dra.put_taint_rule(kube, executing)
    assert replaced["spec"]["taint"]["effect"] == "NoExecute"
    assert [r["metadata"]["name"] for r in await dra.list_taint_rules(kube)] == [
        "gpuop-node-1-gpu-3"
    ]

    assert await dra.delete_taint_rule(kube, "gpuop-node-1-gpu-3") is True
    assert await dra.delete_taint_rule(kube, "gpuop-node-1-gpu-3") is False


def test_a_long_taint_rule_name_is_hashed_to_fit() -> None:
    node = "n" * 250
    name = dra.taint_rule_name(node, "gpu-0")

    assert len(name) == dra.MAX_NAME
    assert name != dra.taint_rule_name(node, "gpu-1")
    assert name == dra.taint_rule_name(node, "gpu-0")


def test_allocation_results_of_a_claim() -> None:
    claim = {"status": {"allocation": {"devices": {"results": [{"device": "gpu-0"}]}}}}

    assert dra.allocation_results(claim) == [{"device": "gpu-0"}]
    assert dra.allocation_results({}) == []
