"""Custom objects: gpuop's own `GPUClusterPolicy` and other operators' resources.

Called by the upgrade orchestrator (reads and watches the cluster policy for desired
driver versions, reports rollout progress in its status) and by network-manager's cluster
role (Multus NetworkAttachmentDefinitions).

A `CustomResource` names a served collection; its objects are plain dicts, created,
listed, watched, patched and deleted with the functions here. The server
has no schema to merge custom objects' lists by key, so changes are JSON merge patches
(RFC 7386: maps merge, null removes a key, lists are replaced whole). A status patch may
carry the resourceVersion it was computed from, turning it into a compare-and-set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.kube.client import Kube
from gpuop.kube.watching import ListWatch

Obj = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class CustomResource:
    """A custom resource's collection: group, served version and plural name."""

    group: str
    version: str
    plural: str
    namespaced: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def scope_arguments(self, namespace: str | None) -> tuple[str, ...]:
        """The leading arguments of the client's methods for this scope."""
        if self.namespaced != (namespace is not None):
            scope = "namespaced" if self.namespaced else "cluster-scoped"
            raise ValueError(f"{self.plural} is {scope}; namespace={namespace!r} does not fit")
        if namespace is None:
            return (self.group, self.version, self.plural)
        return (self.group, self.version, namespace, self.plural)


GPU_CLUSTER_POLICIES = CustomResource("gpuop.io", "v1alpha1", "gpuclusterpolicies")
"""gpuop's cluster policy (cluster-scoped): desired driver versions and upgrade policy."""
NETWORK_ATTACHMENT_DEFINITIONS = CustomResource(
    "k8s.cni.cncf.io", "v1", "network-attachment-definitions", namespaced=True
)
"""Multus' secondary network attachments (namespaced), one per gpuop network."""


async def get(
    kube: Kube, resource: CustomResource, name: str, *, namespace: str | None = None
) -> Obj:
    api = kube.custom_objects
    method = api.get_namespaced_custom_object if namespace else api.get_cluster_custom_object
    return await kube.call(method, *resource.scope_arguments(namespace), name)


async def list_objects(
    kube: Kube,
    resource: CustomResource,
    *,
    namespace: str | None = None,
    label_selector: str | None = None,
) -> list[Obj]:
    """The objects of a collection (a namespaced resource's in every namespace when no
    namespace is given)."""
    api = kube.custom_objects
    selectors = {"label_selector": label_selector} if label_selector else {}
    if resource.namespaced and namespace is None:
        listed = await kube.call(
            api.list_custom_object_for_all_namespaces,
            resource.group,
            resource.version,
            resource.plural,
            **selectors,
        )
    else:
        method = api.list_namespaced_custom_object if namespace else api.list_cluster_custom_object
        listed = await kube.call(method, *resource.scope_arguments(namespace), **selectors)
    items: list[Obj] = listed.get("items") or []
    return items


def watch(
    kube: Kube,
    resource: CustomResource,
    *,
    namespace: str | None = None,
    label_selector: str | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> ListWatch:
    """Every change of the collection; see `watching.ListWatch`. Close it when done."""
    api = kube.custom_objects
    method = api.list_namespaced_custom_object if namespace else api.list_cluster_custom_object
    return ListWatch(
        kube,
        method,
        *resource.scope_arguments(namespace),
        label_selector=label_selector,
        clock=clock,
    )


async def create(kube: Kube, resource: CustomResource, body: Obj) -> Obj:
    """Create the object `body` describes (in its `metadata.namespace` when the resource is
    namespaced); `AlreadyExists` when the name is taken."""
    namespace = body.get("metadata", {}).get("namespace") if resource.namespaced else None
    api = kube.custom_objects
    method = api.create_namespaced_custom_object if namespace else api.create_cluster_custom_object
    return await kube.call(method, *resource.scope_arguments(namespace), body)


async def delete(
    kube: Kube, resource: CustomResource, name: str, *, namespace: str | None = None
) -> None:
    """Delete the object; `NotFound` when it is already gone."""
    api = kube.custom_objects
    method = api.delete_namespaced_custom_object if namespace else api.delete_cluster_custom_object
    await kube.call(method, *resource.scope_arguments(namespace), name)


async def patch(
    kube: Kube, resource: CustomResource, name: str, body: Obj, *, namespace: str | None = None
) -> Obj:
    """Merge-patch the object (status excepted: the server ignores it here)."""
    api = kube.custom_objects
    method = api.patch_namespaced_custom_object if namespace else api.patch_cluster_custom_object
    return await kube.call(
        method, *resource.scope_arguments(namespace), name, body, _content_type=MERGE_PATCH
    )


async def patch_status(
    kube: Kube,
    resource: CustomResource,
    name: str,
    status: Obj,
    *,
    namespace: str | None = None,
    resource_version: str | None = None,
) -> Obj:
    """Merge `status` into the object's status subresource. With `resource_version`, the
    write happens only if the object is still at that version (else `Conflict`)."""
    body: Obj = {"status": status}
    if resource_version is not None:
        body["metadata"] = {"resourceVersion": resource_version}
    api = kube.custom_objects
    method = (
        api.patch_namespaced_custom_object_status
        if namespace
        else api.patch_cluster_custom_object_status
    )
    return await kube.call(
        method, *resource.scope_arguments(namespace), name, body, _content_type=MERGE_PATCH
    )
