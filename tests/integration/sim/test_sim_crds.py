"""CustomResourceDefinitions: generic serving, discovery, schema validation, cleanup."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes.aio import client

from gpuop_sim import ApiServer
from gpuop_sim.apiserver.resources import GroupResource
from tests.integration.sim.support import RawApi, watch_opened

GROUP = "gpuop.io"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "required": ["driver"],
            "properties": {
                "driver": {
                    "type": "object",
                    "required": ["version"],
                    "properties": {
                        "version": {"type": "string", "pattern": "^[0-9.]+$"},
                        "repository": {"type": "string", "default": "nvcr.io/nvidia"},
                    },
                },
                "maxParallelUpgrades": {"type": "integer", "minimum": 0, "default": 1},
                "maxUnavailable": {"x-kubernetes-int-or-string": True},
                "strategy": {"type": "string", "enum": ["rolling", "all-at-once"]},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
        },
        "status": {
            "type": "object",
            "properties": {"state": {"type": "string"}},
        },
    },
}


def crd(plural: str, kind: str, scope: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
            "scope": scope,
            "versions": [
                {
                    "name": "v1alpha1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": SCHEMA},
                    "subresources": {"status": {}},
                }
            ],
        },
    }


def policy(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "GPUClusterPolicy",
        "metadata": {"name": name},
        "spec": {"driver": {"version": "550.90"}, **spec},
    }


@pytest.fixture
async def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    extensions = client.ApiextensionsV1Api(api)
    await extensions.create_custom_resource_definition(
        crd("gpuclusterpolicies", "GPUClusterPolicy", "Cluster")
    )
    await extensions.create_custom_resource_definition(
        crd("nodeupgrades", "NodeUpgrade", "Namespaced")
    )
    return client.CustomObjectsApi(api)


async def test_created_crd_is_established_and_discoverable(
    api: client.ApiClient, custom: client.CustomObjectsApi, raw: RawApi
) -> None:
    read = await client.ApiextensionsV1Api(api).read_custom_resource_definition(
        f"gpuclusterpolicies.{GROUP}"
    )
    _, groups, _ = await raw.request("GET", "/apis")
    _, resources, _ = await raw.request("GET", f"/apis/{GROUP}/v1alpha1")

    conditions = {c.type: c.status for c in read.status.conditions}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}
    assert read.status.accepted_names.list_kind == "GPUClusterPolicyList"
    assert GROUP in [group["name"] for group in groups["groups"]]
    listed = {entry["name"]: entry["namespaced"] for entry in resources["resources"]}
    assert listed == {
        "gpuclusterpolicies": False,
        "gpuclusterpolicies/status": False,
        "nodeupgrades": True,
        "nodeupgrades/status": True,
    }


async def test_cluster_and_namespaced_custom_objects_round_trip(
    custom: client.CustomObjectsApi,
) -> None:
    created = await custom.create_cluster_custom_object(
        GROUP, "v1alpha1", "gpuclusterpolicies", policy("cluster-policy")
    )
    upgrade = {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "NodeUpgrade",
        "metadata": {"name": "node-1"},
        "spec": {"driver": {"version": "550.90"}},
    }
    await custom.create_namespaced_custom_object(
        GROUP, "v1alpha1", "default", "nodeupgrades", upgrade
    )
    patched = await custom.patch_cluster_custom_object(
        GROUP, "v1alpha1", "gpuclusterpolicies", "cluster-policy", {"spec": {"strategy": "rolling"}}
    )
    listed = await custom.list_namespaced_custom_object(
        GROUP, "v1alpha1", "default", "nodeupgrades"
    )

    assert created["metadata"]["generation"] == 1
    assert patched["spec"]["strategy"] == "rolling"
    assert patched["metadata"]["generation"] == 2
    assert [item["metadata"]["name"] for item in listed["items"]] == ["node-1"]


async def test_schema_defaults_are_applied_and_unknown_fields_pruned(
    custom: client.CustomObjectsApi,
) -> None:
    body = policy("p", surprise=True, extra={"anything": {"goes": 1}})

    created = await custom.create_cluster_custom_object(
        GROUP, "v1alpha1", "gpuclusterpolicies", body
    )

    assert "surprise" not in created["spec"]
    assert created["spec"]["extra"] == {"anything": {"goes": 1}}
    assert created["spec"]["maxParallelUpgrades"] == 1
    assert created["spec"]["driver"]["repository"] == "nvcr.io/nvidia"


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        (
            {"maxParallelUpgrades": "two"},
            "spec.maxParallelUpgrades",
            'spec.maxParallelUpgrades: Invalid value: "string": spec.maxParallelUpgrades in body '
            'must be of type integer: "string"',
        ),
        ({"driver": {}}, "spec.driver.version", "spec.driver.version: Required value"),
        (
            {"strategy": "yolo"},
            "spec.strategy",
            'spec.strategy: Unsupported value: "yolo": supported values: "rolling", "all-at-once"',
        ),
        (
            {"maxParallelUpgrades": -1},
            "spec.maxParallelUpgrades",
            "spec.maxParallelUpgrades: Invalid value: -1: spec.maxParallelUpgrades in body should "
            "be greater than or equal to 0",
        ),
        (
            {"maxUnavailable": True},
            "spec.maxUnavailable",
            'spec.maxUnavailable: Invalid value: "boolean": spec.maxUnavailable in body must be '
            "of type int-or-string",
        ),
    ],
)
async def test_schema_violations_are_422_naming_the_field(
    custom: client.CustomObjectsApi, spec: dict[str, Any], field: str, message: str
) -> None:
    body = policy("p")
    body["spec"].update(spec)

    with pytest.raises(client.ApiException) as raised:
        await custom.create_cluster_custom_object(GROUP, "v1alpha1", "gpuclusterpolicies", body)

    status = json.loads(raised.value.body)
    assert raised.value.status == 422
    assert status["reason"] == "Invalid"
    assert status["message"] == f'GPUClusterPolicy.{GROUP} "p" is invalid: {message}'
    assert status["details"]["group"] == GROUP
    assert status["details"]["kind"] == "GPUClusterPolicy"
    assert [cause["field"] for cause in status["details"]["causes"]] == [field]


async def test_missing_spec_lists_every_error_in_brackets(raw: RawApi, custom: object) -> None:
    body = policy("p")
    body["spec"] = {"driver": {"version": 5}, "strategy": "nope"}

    status, answer, _ = await raw.request(
        "POST", f"/apis/{GROUP}/v1alpha1/gpuclusterpolicies", body
    )

    assert status == 422
    assert answer["message"].startswith(f'GPUClusterPolicy.{GROUP} "p" is invalid: [')
    assert len(answer["details"]["causes"]) == 2


async def test_status_subresource_separates_status_from_spec(
    custom: client.CustomObjectsApi,
) -> None:
    body = policy("p")
    body["status"] = {"state": "ignored-on-create"}
    created = await custom.create_cluster_custom_object(
        GROUP, "v1alpha1", "gpuclusterpolicies", body
    )

    status_written = await custom.patch_cluster_custom_object_status(
        GROUP, "v1alpha1", "gpuclusterpolicies", "p", {"status": {"state": "ready"}}
    )
    main_written = await custom.patch_cluster_custom_object(
        GROUP, "v1alpha1", "gpuclusterpolicies", "p", {"status": {"state": "hijacked"}}
    )

    assert "status" not in created
    assert status_written["status"] == {"state": "ready"}
    assert status_written["metadata"]["generation"] == 1
    assert main_written["status"] == {"state": "ready"}


async def test_strategic_merge_patch_on_custom_resource_is_415(
    custom: client.CustomObjectsApi, raw: RawApi
) -> None:
    await custom.create_cluster_custom_object(GROUP, "v1alpha1", "gpuclusterpolicies", policy("p"))

    status, body, _ = await raw.request(
        "PATCH",
        f"/apis/{GROUP}/v1alpha1/gpuclusterpolicies/p",
        {"spec": {"strategy": "rolling"}},
        content_type="application/strategic-merge-patch+json",
    )

    assert (status, body["reason"]) == (415, "UnsupportedMediaType")


async def test_custom_objects_can_be_watched(
    server: ApiServer, custom: client.CustomObjectsApi, raw: RawApi
) -> None:
    stream = asyncio.create_task(
        raw.watch(
            f"/apis/{GROUP}/v1alpha1/namespaces/default/nodeupgrades", {"watch": "1"}, count=1
        )
    )
    await watch_opened(server, GroupResource(GROUP, "nodeupgrades"))
    await custom.create_namespaced_custom_object(
        GROUP,
        "v1alpha1",
        "default",
        "nodeupgrades",
        {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "NodeUpgrade",
            "metadata": {"name": "node-1"},
            "spec": {"driver": {"version": "1"}},
        },
    )

    events = await stream

    assert events[0]["type"] == "ADDED"
    assert events[0]["object"]["kind"] == "NodeUpgrade"


async def test_deleting_a_crd_deletes_its_objects_and_stops_serving(
    server: ApiServer, api: client.ApiClient, custom: client.CustomObjectsApi, raw: RawApi
) -> None:
    await custom.create_cluster_custom_object(GROUP, "v1alpha1", "gpuclusterpolicies", policy("p"))

    await client.ApiextensionsV1Api(api).delete_custom_resource_definition(
        f"gpuclusterpolicies.{GROUP}"
    )
    status, _, _ = await raw.request("GET", f"/apis/{GROUP}/v1alpha1/gpuclusterpolicies")
    _, resources, _ = await raw.request("GET", f"/apis/{GROUP}/v1alpha1")

    assert status == 404
    assert [entry["name"] for entry in resources["resources"]] == [
        "nodeupgrades",
        "nodeupgrades/status",
    ]
    assert server.store.view(GroupResource(GROUP, "gpuclusterpolicies")) == []


async def test_invalid_crd_is_422(api: client.ApiClient) -> None:
    broken = crd("things", "Thing", "Galaxy")
    broken["metadata"]["name"] = "wrong-name"

    with pytest.raises(client.ApiException) as raised:
        await client.ApiextensionsV1Api(api).create_custom_resource_definition(broken)

    fields = [c["field"] for c in json.loads(raised.value.body)["details"]["causes"]]
    assert fields == ["metadata.name", "spec.scope"]
