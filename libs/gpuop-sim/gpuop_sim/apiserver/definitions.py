"""OpenAPI schemas of apimachinery's meta types, and the names upstream gives definitions.

Every group-version document ``openapi.py`` builds carries these beside its kinds, as
kube-apiserver's do: ``ObjectMeta`` (what ``kubectl explain <kind>.metadata`` walks),
``ListMeta``, ``Status``, ``DeleteOptions``, ``Patch`` and what they refer to. The schemas
are written here in OpenAPI 3 form (``$ref`` to ``#/components/schemas/...``, wrapped in
``allOf`` where the reference carries its own description); ``openapi.py`` rewrites the
references for OpenAPI 2. The descriptions are short forms of upstream's.
"""

from __future__ import annotations

from typing import Any

from gpuop_sim.apiserver.resources import ResourceType

Obj = dict[str, Any]

META = "io.k8s.apimachinery.pkg.apis.meta.v1"
OBJECT_META = f"{META}.ObjectMeta"
LIST_META = f"{META}.ListMeta"
STATUS = f"{META}.Status"
DELETE_OPTIONS = f"{META}.DeleteOptions"
PATCH = f"{META}.Patch"
V3_REFERENCE = "#/components/schemas/"

API_VERSION = {
    "description": "APIVersion defines the versioned schema of this representation of an "
    "object. Servers should convert recognized schemas to the latest internal value, and may "
    "reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/"
    "sig-architecture/api-conventions.md#resources",
    "type": "string",
}
KIND = {
    "description": "Kind is a string value representing the REST resource this object "
    "represents. Servers may infer this from the endpoint the client submits requests to. "
    "Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/"
    "devel/sig-architecture/api-conventions.md#types-kinds",
    "type": "string",
}
OBJECT_METADATA_DESCRIPTION = (
    "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/"
    "sig-architecture/api-conventions.md#metadata"
)
LIST_METADATA_DESCRIPTION = (
    "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/"
    "sig-architecture/api-conventions.md#types-kinds"
)

# Upstream's Go package per API group, where it is not the group's first label.
_PACKAGES = {
    "": "io.k8s.api.core",
    "apiextensions.k8s.io": "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions",
    "apiregistration.k8s.io": "io.k8s.kube-aggregator.pkg.apis.apiregistration",
}


def ref(name: str, description: str = "", *, default: Any = None) -> Obj:
    """A reference to a definition; wrapped in ``allOf`` when it has siblings, as in OpenAPI 3
    a ``$ref`` ignores them."""
    if not description and default is None:
        return {"$ref": V3_REFERENCE + name}
    wrapped: Obj = {"allOf": [{"$ref": V3_REFERENCE + name}]}
    if default is not None:
        wrapped["default"] = default
    if description:
        wrapped["description"] = description
    return wrapped


def definition_name(resource: ResourceType, kind: str = "") -> str:
    """``io.k8s.api.core.v1.Pod`` for a built-in kind; the reversed group for a custom one
    (``io.gpuop.v1alpha1.GPUClusterPolicy``), as apiextensions-apiserver names them."""
    group = resource.group
    if resource.schema is not None:
        package = ".".join(reversed(group.split(".")))
    else:
        package = _PACKAGES.get(group) or f"io.k8s.api.{group.split('.')[0]}"
    return f"{package}.{resource.version}.{kind or resource.kind}"


def gvk(group: str, version: str, kind: str) -> Obj:
    return {"group": group, "kind": kind, "version": version}


def _string(description: str) -> Obj:
    return {"description": description, "type": "string"}


def _integer(description: str, bits: int = 64) -> Obj:
    return {"description": description, "format": f"int{bits}", "type": "integer"}


def _strings(description: str, **extensions: Any) -> Obj:
    return {
        "description": description,
        "items": {"default": "", "type": "string"},
        "type": "array",
        **extensions,
    }


def _string_map(description: str) -> Obj:
    return {
        "additionalProperties": {"default": "", "type": "string"},
        "description": description,
        "type": "object",
    }


def meta_definitions(group: str, version: str) -> dict[str, Obj]:
    """The meta types a document of ``group/version`` refers to."""
    time = f"{META}.Time"
    return {
        time: {
            "description": "Time is a wrapper around time.Time which supports correct "
            "marshaling to YAML and JSON; it is written in RFC 3339 form.",
            "format": "date-time",
            "type": "string",
        },
        f"{META}.FieldsV1": {
            "description": "FieldsV1 stores a set of fields in a data structure like a Trie, "
            "in JSON format.",
            "type": "object",
        },
        f"{META}.OwnerReference": {
            "description": "OwnerReference contains enough information to let you identify an "
            "owning object. An owning object must be in the same namespace as the dependent, "
            "or be cluster-scoped, so there is no namespace field.",
            "properties": {
                "apiVersion": _string("API version of the referent."),
                "blockOwnerDeletion": {
                    "description": "If true, and the owner has the foregroundDeletion "
                    "finalizer, the owner cannot be deleted from the key-value store until "
                    "this reference is removed.",
                    "type": "boolean",
                },
                "controller": {
                    "description": "If true, this reference points to the managing controller.",
                    "type": "boolean",
                },
                "kind": _string("Kind of the referent."),
                "name": _string("Name of the referent."),
                "uid": _string("UID of the referent."),
            },
            "required": ["apiVersion", "kind", "name", "uid"],
            "type": "object",
            "x-kubernetes-map-type": "atomic",
        },
        f"{META}.ManagedFieldsEntry": {
            "description": "ManagedFieldsEntry is a workflow-id, a FieldSet and the group "
            "version of the resource that the fieldset applies to.",
            "properties": {
                "apiVersion": _string("APIVersion of the resource this field set applies to."),
                "fieldsType": _string("The format of the field set; only FieldsV1 exists."),
                "fieldsV1": ref(f"{META}.FieldsV1", "The field set, in FieldsV1 format."),
                "manager": _string("Identifier of the workflow managing these fields."),
                "operation": _string(
                    "The kind of operation that led to this entry: Apply or Update."
                ),
                "subresource": _string("The subresource used to update the object, if any."),
                "time": ref(time, "When this entry was last changed."),
            },
            "type": "object",
        },
        OBJECT_META: {
            "description": "ObjectMeta is metadata that all persisted resources must have, "
            "which includes all objects users must create.",
            "properties": {
                "annotations": _string_map(
                    "Annotations is an unstructured key value map stored with a resource "
                    "that may be set by external tools to store and retrieve arbitrary metadata."
                ),
                "creationTimestamp": ref(
                    time, "When this object was created, set by the server.", default={}
                ),
                "deletionGracePeriodSeconds": _integer(
                    "Seconds allowed for this object to terminate gracefully before it is "
                    "removed from the system. Only set when deletionTimestamp is also set."
                ),
                "deletionTimestamp": ref(
                    time,
                    "When this object will be deleted, set by the server when a graceful "
                    "deletion is requested.",
                ),
                "finalizers": _strings(
                    "Must be empty before the object is deleted from the registry.",
                    **{"x-kubernetes-list-type": "set", "x-kubernetes-patch-strategy": "merge"},
                ),
                "generateName": _string(
                    "An optional prefix, used by the server to generate a unique name ONLY "
                    "IF the Name field has not been provided."
                ),
                "generation": _integer(
                    "A sequence number representing a specific generation of the desired state."
                ),
                "labels": _string_map(
                    "Map of string keys and values that can be used to organize and "
                    "categorize (scope and select) objects."
                ),
                "managedFields": {
                    "description": "Maps workflow-id and version to the set of fields that "
                    "are managed by that workflow.",
                    "items": ref(f"{META}.ManagedFieldsEntry", default={}),
                    "type": "array",
                    "x-kubernetes-list-type": "atomic",
                },
                "name": _string(
                    "Name must be unique within a namespace. Is required when creating "
                    "resources, although some resources may allow a client to request the "
                    "generation of an appropriate name automatically. Cannot be updated."
                ),
                "namespace": _string(
                    "Namespace defines the space within which each name must be unique. An "
                    'empty namespace is equivalent to the "default" namespace. Cannot be updated.'
                ),
                "ownerReferences": {
                    "description": "List of objects depended by this object. If ALL objects "
                    "in the list have been deleted, this object will be garbage collected.",
                    "items": ref(f"{META}.OwnerReference", default={}),
                    "type": "array",
                    "x-kubernetes-list-map-keys": ["uid"],
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-patch-merge-key": "uid",
                    "x-kubernetes-patch-strategy": "merge",
                },
                "resourceVersion": _string(
                    "An opaque value that represents the internal version of this object "
                    "that can be used by clients to determine when objects have changed."
                ),
                "selfLink": _string("Deprecated: selfLink is a legacy read-only field."),
                "uid": _string(
                    "UID is the unique in time and space value for this object. It is "
                    "generated by the server on successful creation of a resource."
                ),
            },
            "type": "object",
        },
        LIST_META: {
            "description": "ListMeta describes metadata that synthetic resources must have, "
            "including lists and various status objects.",
            "properties": {
                "continue": _string(
                    "Set when the list was truncated: pass it as the continue parameter to "
                    "get the next page."
                ),
                "remainingItemCount": _integer(
                    "The number of subsequent items in the list which are not included in "
                    "this list response."
                ),
                "resourceVersion": _string(
                    "The version of the list, for watches and optimistic concurrency."
                ),
                "selfLink": _string("Deprecated: selfLink is a legacy read-only field."),
            },
            "type": "object",
        },
        f"{META}.StatusCause": {
            "description": "StatusCause provides more information about an api.Status failure, "
            "including cases when multiple errors are encountered.",
            "properties": {
                "field": _string("The field of the resource that has caused this error."),
                "message": _string("A human-readable description of the cause of the error."),
                "reason": _string("A machine-readable description of the cause of the error."),
            },
            "type": "object",
        },
        f"{META}.StatusDetails": {
            "description": "StatusDetails is a set of additional properties that MAY be set by "
            "the server to provide additional information about a response.",
            "properties": {
                "causes": {
                    "description": "The Causes array includes more details associated with "
                    "the StatusReason failure.",
                    "items": ref(f"{META}.StatusCause", default={}),
                    "type": "array",
                    "x-kubernetes-list-type": "atomic",
                },
                "group": _string(
                    "The group attribute of the resource associated with the status StatusReason."
                ),
                "kind": _string(
                    "The kind attribute of the resource associated with the status StatusReason."
                ),
                "name": _string(
                    "The name attribute of the resource associated with the status StatusReason."
                ),
                "retryAfterSeconds": _integer(
                    "If specified, the time in seconds before the operation should be retried.",
                    32,
                ),
                "uid": _string("UID of the resource."),
            },
            "type": "object",
        },
        STATUS: {
            "description": "Status is a return value for calls that don't return other objects.",
            "properties": {
                "apiVersion": API_VERSION,
                "code": _integer("Suggested HTTP return code for this status, 0 if not set.", 32),
                "details": ref(
                    f"{META}.StatusDetails",
                    "Extended data associated with the reason. Each reason may define its own "
                    "extended details.",
                ),
                "kind": KIND,
                "message": _string("A human-readable description of the status of this operation."),
                "metadata": ref(LIST_META, LIST_METADATA_DESCRIPTION, default={}),
                "reason": _string(
                    "A machine-readable description of why this operation is in "
                    'the "Failure" status.'
                ),
                "status": _string('Status of the operation. One of: "Success" or "Failure".'),
            },
            "type": "object",
            "x-kubernetes-group-version-kind": [gvk("", "v1", "Status")],
        },
        f"{META}.Preconditions": {
            "description": "Preconditions must be fulfilled before an operation (update, "
            "delete, etc.) is carried out.",
            "properties": {
                "resourceVersion": _string("Specifies the target ResourceVersion"),
                "uid": _string("Specifies the target UID."),
            },
            "type": "object",
        },
        DELETE_OPTIONS: {
            "description": "DeleteOptions may be provided when deleting an API object.",
            "properties": {
                "apiVersion": API_VERSION,
                "dryRun": _strings(
                    "When present, indicates that modifications should not be persisted. "
                    "Valid values: All.",
                    **{"x-kubernetes-list-type": "atomic"},
                ),
                "gracePeriodSeconds": _integer(
                    "The duration in seconds before the object should be deleted."
                ),
                "kind": KIND,
                "orphanDependents": {
                    "description": "Deprecated: use propagationPolicy.",
                    "type": "boolean",
                },
                "preconditions": ref(
                    f"{META}.Preconditions",
                    "Must be fulfilled before a deletion is carried out.",
                ),
                "propagationPolicy": _string(
                    "Whether and how garbage collection will be performed: Orphan, "
                    "Background or Foreground."
                ),
            },
            "type": "object",
            "x-kubernetes-group-version-kind": [
                gvk(g, v, "DeleteOptions") for g, v in dict.fromkeys([("", "v1"), (group, version)])
            ],
        },
        PATCH: {
            "description": "Patch is provided to give a concrete name and type to the "
            "Kubernetes PATCH request body.",
            "type": "object",
        },
    }
