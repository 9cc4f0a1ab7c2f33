"""How an update turns the client's object into the one stored.

The rules a real API server's update path applies before validation: the body must name
the object in the URL, a ``metadata.uid`` or ``metadata.resourceVersion`` in it is a
precondition (409), server-managed metadata is carried over from the stored object, a
write to the main resource leaves ``status`` alone while a write to the ``status``
subresource changes nothing else, empty metadata collections are dropped as Go's
``omitempty`` does, and a write that changes nothing is recognised as a no-op.
Used by the registry for PUT, PATCH and in-process mutations.
"""

from __future__ import annotations

import copy
from typing import Any

from gpuop_sim.apiserver import errors
from gpuop_sim.apiserver.resources import ResourceType

Obj = dict[str, Any]

SERVER_METADATA = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
)
_OMITTED_WHEN_EMPTY = ("labels", "annotations", "finalizers", "ownerReferences", "managedFields")


def metadata_of(obj: Any) -> Obj:
    """The object's metadata, created if absent; 400 when the body is no object."""
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata", {}), dict):
        raise errors.bad_request("the body of the request is not a Kubernetes object")
    metadata: Obj = obj.setdefault("metadata", {})
    return metadata


def check_name(metadata: Obj, name: str) -> None:
    if metadata.get("name") != name:
        raise errors.bad_request(
            f"the name of the object ({metadata.get('name', '')}) does not match the name "
            f"on the URL ({name})"
        )


def check_preconditions(resource: ResourceType, old: Obj, metadata: Obj) -> None:
    """A uid or resourceVersion in the written object must match the stored one."""
    name = old["metadata"]["name"]
    uid = metadata.get("uid")
    if uid and uid != old["metadata"]["uid"]:
        raise errors.conflict(
            resource.group_resource,
            name,
            f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
            f"{old['metadata']['uid']}",
        )
    version = metadata.get("resourceVersion")
    if version and version != old["metadata"]["resourceVersion"]:
        raise errors.stale(resource.group_resource, name)


def merge(resource: ResourceType, old: Obj, body: Obj, subresource: str | None) -> Obj:
    """The object to store: the body with server fields restored, or for ``status``
    writes the stored object with only its status replaced."""
    if subresource == "status":
        new = copy.deepcopy(old)
        if "status" in body:
            new["status"] = body["status"]
        else:
            new.pop("status", None)
        return new
    new = body
    new["apiVersion"], new["kind"] = resource.api_version, resource.kind
    metadata = new["metadata"]
    for key in ("managedFields", "selfLink", *SERVER_METADATA):
        metadata.pop(key, None)
        if key in old["metadata"]:
            metadata[key] = old["metadata"][key]
    if resource.has_status:
        if "status" in old:
            new["status"] = copy.deepcopy(old["status"])
        else:
            new.pop("status", None)
    return new


def spec_of(resource: ResourceType, obj: Obj) -> Obj:
    """What ``generation`` tracks: everything but metadata (and status, when separate)."""
    skipped = ("metadata", "apiVersion", "kind") + (("status",) if resource.has_status else ())
    return {k: v for k, v in obj.items() if k not in skipped}


def tidy_metadata(obj: Obj) -> None:
    """Drop empty collections from metadata, as Go's ``omitempty`` encoding of ObjectMeta
    does: a client that clears the last finalizer reads back no ``finalizers`` at all."""
    metadata = obj["metadata"]
    for key in _OMITTED_WHEN_EMPTY:
        if key in metadata and not metadata[key]:
            del metadata[key]


def comparable(obj: Obj) -> Obj:
    """The object without the fields a no-op write may differ in: its resourceVersion and
    the times of its managedFields entries (ownership itself counts: an apply that only
    shares a field is a write)."""
    metadata = {
        k: v
        for k, v in obj.get("metadata", {}).items()
        if k not in ("resourceVersion", "managedFields")
    }
    metadata["managedFields"] = [
        {k: v for k, v in entry.items() if k != "time"}
        for entry in obj.get("metadata", {}).get("managedFields") or []
        if isinstance(entry, dict)
    ]
    return {**{k: v for k, v in obj.items() if k != "apiVersion"}, "metadata": metadata}
