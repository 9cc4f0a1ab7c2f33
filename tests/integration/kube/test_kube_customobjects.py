"""Custom objects: the GPUClusterPolicy read, listed, watched, patched and its status
written, with compare-and-set on the resourceVersion."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes.aio import client as k8s

from gpuop.kube import client, customobjects, errors
from gpuop.kube.customobjects import GPU_CLUSTER_POLICIES, CustomResource

OPEN = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
WIDGETS = CustomResource("example.gpuop.io", "v1", "widgets", namespaced=True)


def crd(resource: CustomResource, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{resource.plural}.{resource.group}"},
        "spec": {
            "group": resource.group,
            "names": {"plural": resource.plural, "singular": kind.lower(), "kind": kind},
            "scope": "Namespaced" if resource.namespaced else "Cluster",
            "versions": [
                {
                    "name": resource.version,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": OPEN, "status": OPEN},
                        }
                    },
                    "subresources": {"status": {}},
                }
            ],
        },
    }


def custom(resource: CustomResource, kind: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": resource.api_version,
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }


@pytest.fixture
async def policies(kube: client.Kube) -> None:
    extensions = k8s.ApiextensionsV1Api(kube.api_client)
    for resource, kind in ((GPU_CLUSTER_POLICIES, "GPUClusterPolicy"), (WIDGETS, "Widget")):
        await kube.call(extensions.create_custom_resource_definition, crd(resource, kind))
    await kube.call(
        kube.custom_objects.create_cluster_custom_object,
        "gpuop.io",
        "v1alpha1",
        "gpuclusterpolicies",
        custom(GPU_CLUSTER_POLICIES, "GPUClusterPolicy", "cluster", driver={"version": "550.90"}),
    )


@pytest.mark.usefixtures("policies")
async def test_get_and_list_the_cluster_policy(kube: client.Kube) -> None:
    policy = await customobjects.get(kube, GPU_CLUSTER_POLICIES, "cluster")
    listed = await customobjects.list_objects(kube, GPU_CLUSTER_POLICIES)

    assert policy["spec"]["driver"] == {"version": "550.90"}
    assert [item["metadata"]["name"] for item in listed] == ["cluster"]


@pytest.mark.usefixtures("policies")
async def test_status_is_merged_into_the_status_subresource(kube: client.Kube) -> None:
    await customobjects.patch_status(
        kube, GPU_CLUSTER_POLICIES, "cluster", {"state": "rolling", "nodes": {"done": 1}}
    )
    written = await customobjects.patch_status(
        kube, GPU_CLUSTER_POLICIES, "cluster", {"nodes": {"upgrading": 2}}
    )

    assert written["status"] == {"state": "rolling", "nodes": {"done": 1, "upgrading": 2}}
    assert written["spec"]["driver"] == {"version": "550.90"}


@pytest.mark.usefixtures("policies")
async def test_a_status_patch_from_a_stale_read_is_a_conflict(kube: client.Kube) -> None:
    read = await customobjects.get(kube, GPU_CLUSTER_POLICIES, "cluster")
    await customobjects.patch(
        kube, GPU_CLUSTER_POLICIES, "cluster", {"spec": {"driver": {"version": "560.35"}}}
    )

    with pytest.raises(errors.Conflict):
        await customobjects.patch_status(
            kube,
            GPU_CLUSTER_POLICIES,
            "cluster",
            {"state": "done"},
            resource_version=read["metadata"]["resourceVersion"],
        )

    fresh = await customobjects.get(kube, GPU_CLUSTER_POLICIES, "cluster")
    written = await customobjects.patch_status(
        kube,
        GPU_CLUSTER_POLICIES,
        "cluster",
        {"state": "rolling"},
        resource_version=fresh["metadata"]["resourceVersion"],
    )
    assert written["status"] == {"state": "rolling"}


@pytest.mark.usefixtures("policies")
async def test_a_watch_sees_the_policy_change(kube: client.Kube) -> None:
    async with customobjects.watch(kube, GPU_CLUSTER_POLICIES) as watch:
        added = await asyncio.wait_for(anext(watch), 5)
        await customobjects.patch(
            kube, GPU_CLUSTER_POLICIES, "cluster", {"spec": {"driver": {"version": "560.35"}}}
        )
        modified = await asyncio.wait_for(anext(watch), 5)

    assert added.type == "ADDED"
    assert added.object["kind"] == "GPUClusterPolicy"
    assert modified.type == "MODIFIED"
    assert modified.object["spec"]["driver"] == {"version": "560.35"}


@pytest.mark.usefixtures("policies")
async def test_namespaced_custom_objects(kube: client.Kube) -> None:
    body = custom(WIDGETS, "Widget", "w", size=1)
    await kube.call(
        kube.custom_objects.create_namespaced_custom_object,
        WIDGETS.group,
        WIDGETS.version,
        "default",
        WIDGETS.plural,
        body,
    )

    await customobjects.patch_status(kube, WIDGETS, "w", {"ready": True}, namespace="default")
    everywhere = await customobjects.list_objects(kube, WIDGETS)
    here = await customobjects.get(kube, WIDGETS, "w", namespace="default")

    assert [item["metadata"]["name"] for item in everywhere] == ["w"]
    assert here["status"] == {"ready": True}


async def test_a_scope_mismatch_is_a_programming_error(kube: client.Kube) -> None:
    with pytest.raises(ValueError, match="cluster-scoped"):
        await customobjects.get(kube, GPU_CLUSTER_POLICIES, "cluster", namespace="default")
    with pytest.raises(ValueError, match="namespaced"):
        await customobjects.get(kube, WIDGETS, "w")


async def test_an_uninstalled_resource_is_not_found(kube: client.Kube) -> None:
    with pytest.raises(errors.NotFound):
        await customobjects.get(kube, GPU_CLUSTER_POLICIES, "cluster")
