"""DRA ResourceClaims (`resource.k8s.io/v1`): served, discovered, the allocation written
through the status subresource only, the spec immutable."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.aio import client

from tests.integration.sim.support import RawApi

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
MERGE = "application/merge-patch+json"
ALLOCATION = {
    "allocation": {
        "devices": {
            "results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-0"}
            ]
        }
    }
}


def claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": ALLOCATION,  # a create leaves status to the scheduler
    }


async def test_resourceclaims_are_discovered(raw: RawApi) -> None:
    _, groups, _ = await raw.request("GET", "/apis")
    _, resources, _ = await raw.request("GET", "/apis/resource.k8s.io/v1")

    assert "resource.k8s.io" in {group["name"] for group in groups["groups"]}
    by_name = {entry["name"]: entry for entry in resources["resources"]}
    assert by_name["resourceclaims"]["namespaced"] is True
    assert by_name["resourceclaims"]["kind"] == "ResourceClaim"
    assert "resourceclaims/status" in by_name


async def test_the_allocation_is_written_through_the_status_subresource(
    raw: RawApi, api: client.ApiClient
) -> None:
    status, created, _ = await raw.request("POST", CLAIMS, claim("train"))
    assert status == 201 and "status" not in created

    status, patched, _ = await raw.request(
        "PATCH", f"{CLAIMS}/train/status", {"status": ALLOCATION}, content_type=MERGE
    )
    assert status == 200, patched

    read = await client.ResourceV1Api(api).read_namespaced_resource_claim("train", "default")
    assert [r.driver for r in read.status.allocation.devices.results] == ["gpu.nvidia.com"]


async def test_a_claims_spec_is_immutable(raw: RawApi) -> None:
    await raw.request("POST", CLAIMS, claim("train"))
    changed = {"spec": {"devices": {"requests": [{"name": "two-gpus"}]}}}

    status, body, _ = await raw.request("PATCH", f"{CLAIMS}/train", changed, content_type=MERGE)

    assert status == 422, body
    assert body["reason"] == "Invalid"
    assert "field is immutable" in body["message"]


@pytest.mark.parametrize("path", [CLAIMS, "/apis/resource.k8s.io/v1/resourceclaims"])
async def test_claims_are_listed_per_namespace_and_cluster_wide(raw: RawApi, path: str) -> None:
    await raw.request("POST", CLAIMS, claim("a"))

    status, listed, _ = await raw.request("GET", path)

    assert status == 200 and listed["kind"] == "ResourceClaimList"
    assert [item["metadata"]["name"] for item in listed["items"]] == ["a"]
