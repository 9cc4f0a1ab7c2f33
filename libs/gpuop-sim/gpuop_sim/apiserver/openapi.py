"""The OpenAPI documents, built from the catalog on every request: ``/openapi/v2``,
``/openapi/v3`` and ``/openapi/v3/<group-version>``.

kubectl reads them: ``kubectl explain`` walks a kind's schema in the v3 document of its
group-version (found by ``x-kubernetes-group-version-kind``), and ``kubectl apply``/
``create`` look there for a PATCH operation of the kind that takes ``fieldValidation``, to
leave validation to the server. A custom resource's schema is its CRD's
``openAPIV3Schema``, with ``apiVersion``, ``kind`` and ``metadata`` (``ObjectMeta``)
added, named as apiextensions-apiserver names it (``io.gpuop.v1alpha1.GPUClusterPolicy``). A
built-in kind has no schema here beyond its type and metadata: it preserves unknown fields.

HTTP, as kube-openapi and kube-aggregator serve them:

- ``/openapi/v3`` lists every group-version with a ``serverRelativeURL`` whose ``hash`` is
  the ETag of its document (the upper-case SHA-512 of its JSON), so it changes when a CRD
  does. A group-version's document asked for with its current hash is cacheable forever
  (``Cache-Control: public, immutable``); with an old hash the answer is a ``301`` to the
  current one; an unknown group-version is a ``404`` with no body.
- Every document carries a quoted ``ETag``; ``If-None-Match`` with it answers ``304``.
- Only JSON is served: an ``Accept`` that allows no JSON (kube-apiserver would also offer
  protobuf, which client-go asks for on ``/openapi/v2``) gets ``406``.

Where the simulated server differs on purpose: PATCH operations offer JSON patch and merge
patch only. A built-in kind's PATCH does accept strategic merge, but advertising it would
make ``kubectl apply`` compute its patches from these schemas, which lack the merge keys of
the real ones; without it kubectl uses the ones compiled into it, as for a server that
publishes no v3 document. Server-side apply (``application/apply-patch+yaml``, with the
``force`` parameter) is offered, as ``applying.py`` serves it.
"""

from __future__ import annotations

import copy
import datetime
import email.utils
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gpuop_sim.apiserver import definitions, errors
from gpuop_sim.apiserver.definitions import gvk, ref
from gpuop_sim.apiserver.discovery import KUBERNETES_VERSION
from gpuop_sim.apiserver.resources import Catalog, ResourceType

Obj = dict[str, Any]
Parameter = tuple[str, str, str]
"""A query parameter: name, JSON type, description."""

V2 = "/openapi/v2"
V3 = "/openapi/v3"
JSON = "application/json"
EVICTION = "io.k8s.api.policy.v1.Eviction"
_V2_REFERENCE = "#/definitions/"
_PATCH_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/apply-patch+yaml",
)
_SECURITY = {
    "BearerToken": {
        "description": "Bearer Token authentication",
        "in": "header",
        "name": "authorization",
        "type": "apiKey",
    }
}

_LIST: tuple[Parameter, ...] = (
    ("allowWatchBookmarks", "boolean", "Requests watch events with type BOOKMARK."),
    ("continue", "string", "The continue token of the previous page of a paged list."),
    ("fieldSelector", "string", "A selector to restrict the list by the objects' fields."),
    ("labelSelector", "string", "A selector to restrict the list by the objects' labels."),
    ("limit", "integer", "The most objects a list answer holds; more are paged."),
    ("resourceVersion", "string", "Which version of the objects a list or watch starts at."),
    ("resourceVersionMatch", "string", "How resourceVersion applies to a list."),
    ("sendInitialEvents", "boolean", "Starts a watch with the current objects (a stream)."),
    ("timeoutSeconds", "integer", "Ends the list or watch after this many seconds."),
    ("watch", "boolean", "Watches for changes, as a stream of add, update and remove events."),
)
_WRITE: tuple[Parameter, ...] = (
    ("dryRun", "string", "When present (All), modifications are not persisted."),
    ("fieldManager", "string", "A name for the actor or entity making these changes."),
    (
        "fieldValidation",
        "string",
        "What to do with unknown or duplicate fields: Ignore, Warn or Strict.",
    ),
)
_PATCH: tuple[Parameter, ...] = (
    *_WRITE,
    (
        "force",
        "boolean",
        "Takes the fields of conflicting managers (apply patches only).",
    ),
)
_DELETE: tuple[Parameter, ...] = (
    ("dryRun", "string", "When present (All), modifications are not persisted."),
    ("gracePeriodSeconds", "integer", "Seconds before the object is deleted."),
    ("orphanDependents", "boolean", "Deprecated: use propagationPolicy."),
    ("propagationPolicy", "string", "Orphan, Background or Foreground garbage collection."),
)


@dataclass(frozen=True)
class _Operation:
    """One operation of a path, rendered for OpenAPI 3 or 2."""

    action: str
    """``x-kubernetes-action``: list, post, get, put, patch, delete or deletecollection."""
    operation_id: str
    description: str
    kind: Obj
    response: str
    parameters: tuple[Parameter, ...] = ()
    request: str = ""
    """The body's definition name; ``Patch`` for a patch document."""
    created: bool = False


def group_version_path(group: str, version: str) -> str:
    """``api/v1`` or ``apis/<group>/<version>``: a document's key in ``/openapi/v3``."""
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _served(catalog: Catalog) -> dict[str, list[ResourceType]]:
    served: dict[str, list[ResourceType]] = {}
    for group, versions in sorted(catalog.groups().items()):
        for version in versions:
            if resources := catalog.in_group_version(group, version):
                served[group_version_path(group, version)] = resources
    return served


def _kind_schema(resource: ResourceType) -> Obj:
    """A CRD's schema with the type and object metadata added, as apiextensions-apiserver
    publishes it; for a built-in kind, only those and any other field allowed."""
    default: Obj | None = None
    if resource.schema is not None:
        schema = copy.deepcopy(resource.schema)
        schema.setdefault("type", "object")
        properties = schema.setdefault("properties", {})
    else:
        schema = {"description": resource.description, "type": "object"}
        schema["x-kubernetes-preserve-unknown-fields"] = True
        properties = schema["properties"] = {}
        default = {}
    properties["apiVersion"] = definitions.API_VERSION
    properties["kind"] = definitions.KIND
    description = definitions.OBJECT_METADATA_DESCRIPTION
    properties["metadata"] = ref(definitions.OBJECT_META, description, default=default)
    schema["x-kubernetes-group-version-kind"] = [
        gvk(resource.group, resource.version, resource.kind)
    ]
    return schema


def _list_schema(resource: ResourceType) -> Obj:
    items = (
        f"List of {resource.plural}. More info: https://git.k8s.io/community/contributors/"
        "devel/sig-architecture/api-conventions.md"
    )
    return {
        "description": f"{resource.list_kind} is a list of {resource.kind}",
        "properties": {
            "apiVersion": definitions.API_VERSION,
            "items": {
                "description": items,
                "items": ref(definitions.definition_name(resource)),
                "type": "array",
            },
            "kind": definitions.KIND,
            "metadata": ref(definitions.LIST_META, definitions.LIST_METADATA_DESCRIPTION),
        },
        "required": ["items"],
        "type": "object",
        "x-kubernetes-group-version-kind": [
            gvk(resource.group, resource.version, resource.list_kind)
        ],
    }


def _operation_group(resource: ResourceType) -> str:
    """``CoreV1``, ``CoordinationV1``, ``GpuopIoV1alpha1``: the group in operation ids."""
    words = (resource.group or "core").removesuffix(".k8s.io").replace("-", ".").split(".")
    version = resource.version[0].upper() + resource.version[1:]
    return "".join(word[:1].upper() + word[1:] for word in words) + version


def _paths(resource: ResourceType) -> dict[str, dict[str, _Operation]]:
    """Each URL of ``resource``, with its operations by HTTP method."""
    kind, verbs = resource.kind, set(resource.verbs)
    group_id = _operation_group(resource)
    scope = "Namespaced" if resource.namespaced else ""
    article = "an" if kind[:1] in "AEIOU" else "a"
    prefix = f"/{group_version_path(resource.group, resource.version)}"
    collection = f"{prefix}/{resource.plural}"
    if resource.namespaced:
        collection = f"{prefix}/namespaces/{{namespace}}/{resource.plural}"
    item = f"{collection}/{{name}}"
    this, own = definitions.definition_name(resource), gvk(resource.group, resource.version, kind)
    paths: dict[str, dict[str, _Operation]] = {}

    def add(path: str, method: str, action: str, verb: str, description: str, **more: Any) -> None:
        suffix = more.pop("suffix", "")
        operation_id = more.pop("operation_id", f"{verb}{group_id}{scope}{kind}{suffix}")
        more.setdefault("response", this)
        paths.setdefault(path, {})[method] = _Operation(
            action, operation_id, description, more.pop("kind", own), **more
        )

    if "list" in verbs:
        listed = definitions.definition_name(resource, resource.list_kind)
        described = f"list or watch objects of kind {kind}"
        add(collection, "get", "list", "list", described, response=listed, parameters=_LIST)
        if resource.namespaced:
            add(
                f"{prefix}/{resource.plural}",
                "get",
                "list",
                "list",
                described,
                response=listed,
                parameters=_LIST,
                operation_id=f"list{group_id}{kind}ForAllNamespaces",
            )
    if "create" in verbs:
        add(
            collection,
            "post",
            "post",
            "create",
            f"create {article} {kind}",
            parameters=_WRITE,
            request=this,
            created=True,
        )
    if "deletecollection" in verbs:
        add(
            collection,
            "delete",
            "deletecollection",
            "delete",
            f"delete collection of {kind}",
            response=definitions.STATUS,
            parameters=_LIST + _DELETE,
            operation_id=f"delete{group_id}Collection{scope}{kind}",
        )
    subresources = [("", "")] + [("/status", "Status")] * ("status" in resource.subresources)
    for path_suffix, suffix in subresources:
        path, sub = item + path_suffix, " status of" if suffix else ""
        if "get" in verbs:
            add(path, "get", "get", "read", f"read{sub} the specified {kind}", suffix=suffix)
        if "update" in verbs:
            add(
                path,
                "put",
                "put",
                "replace",
                f"replace{sub} the specified {kind}",
                suffix=suffix,
                parameters=_WRITE,
                request=this,
                created=True,
            )
        if "patch" in verbs:
            add(
                path,
                "patch",
                "patch",
                "patch",
                f"partially update{sub} the specified {kind}",
                suffix=suffix,
                parameters=_PATCH,
                request=definitions.PATCH,
            )
    if "delete" in verbs:
        add(
            item,
            "delete",
            "delete",
            "delete",
            f"delete {article} {kind}",
            response=definitions.STATUS,
            parameters=_DELETE,
        )
    if "eviction" in resource.subresources:
        add(
            f"{item}/eviction",
            "post",
            "post",
            "create",
            f"create eviction of {article} {kind}",
            suffix="Eviction",
            kind=gvk("policy", "v1", "Eviction"),
            response=EVICTION,
            parameters=_WRITE,
            request=EVICTION,
            created=True,
        )
    return paths


def _path_parameters(path: str, kind: str) -> list[tuple[str, str]]:
    found = [("name", f"name of the {kind}")] if "{name}" in path else []
    if "{namespace}" in path:
        found.append(("namespace", "object name and auth scope, such as for teams and projects"))
    return found


def _v3_operation(operation: _Operation) -> Obj:
    content = {JSON: {"schema": ref(operation.response)}}
    responses: Obj = {"200": {"description": "OK", "content": content}}
    if operation.created:
        responses["201"] = {"description": "Created", "content": content}
    responses["401"] = {"description": "Unauthorized"}
    rendered: Obj = {
        "description": operation.description,
        "operationId": operation.operation_id,
        "parameters": [
            {"description": text, "in": "query", "name": name, "schema": {"type": kind}}
            for name, kind, text in operation.parameters
        ],
        "responses": responses,
        "x-kubernetes-action": operation.action,
        "x-kubernetes-group-version-kind": operation.kind,
    }
    if operation.request:
        types = _PATCH_TYPES if operation.request == definitions.PATCH else ("*/*",)
        body = {"schema": ref(operation.request)}
        rendered["requestBody"] = {"content": dict.fromkeys(types, body), "required": True}
    return rendered


def _v2_operation(operation: _Operation) -> Obj:
    schema = {"$ref": _V2_REFERENCE + operation.response}
    responses: Obj = {"200": {"description": "OK", "schema": schema}}
    if operation.created:
        responses["201"] = {"description": "Created", "schema": schema}
    responses["401"] = {"description": "Unauthorized"}
    parameters: list[Obj] = []
    consumes = ["*/*"]
    if operation.request:
        if operation.request == definitions.PATCH:
            consumes = list(_PATCH_TYPES)
        body = {"$ref": _V2_REFERENCE + operation.request}
        parameters.append({"in": "body", "name": "body", "required": True, "schema": body})
    parameters += [
        {"description": text, "in": "query", "name": name, "type": kind, "uniqueItems": True}
        for name, kind, text in operation.parameters
    ]
    return {
        "consumes": consumes,
        "description": operation.description,
        "operationId": operation.operation_id,
        "parameters": parameters,
        "produces": [JSON],
        "responses": responses,
        "schemes": ["https"],
        "x-kubernetes-action": operation.action,
        "x-kubernetes-group-version-kind": operation.kind,
    }


Paths = dict[str, tuple[str, dict[str, _Operation]]]
"""Each URL with the kind it serves and its operations by HTTP method."""


def _contents(resources: list[ResourceType]) -> tuple[dict[str, Obj], Paths]:
    """The schemas of a group-version's kinds (OpenAPI 3 form), and its operations."""
    schemas: dict[str, Obj] = {}
    paths: Paths = {}
    for resource in resources:
        schemas[definitions.definition_name(resource)] = _kind_schema(resource)
        if "list" in resource.verbs:
            list_name = definitions.definition_name(resource, resource.list_kind)
            schemas[list_name] = _list_schema(resource)
        if "eviction" in resource.subresources:
            schemas[EVICTION] = {
                "description": "Eviction evicts a pod from its node subject to certain "
                "policies and safety constraints.",
                "properties": {"apiVersion": definitions.API_VERSION, "kind": definitions.KIND},
                "type": "object",
                "x-kubernetes-group-version-kind": [gvk("policy", "v1", "Eviction")],
                "x-kubernetes-preserve-unknown-fields": True,
            }
        for path, operations in _paths(resource).items():
            paths.setdefault(path, (resource.kind, {}))[1].update(operations)
    return schemas, paths


def _v3_document(resources: list[ResourceType]) -> Obj:
    schemas, paths = _contents(resources)
    schemas.update(definitions.meta_definitions(resources[0].group, resources[0].version))
    rendered: Obj = {}
    for path, (kind, operations) in sorted(paths.items()):
        rendered[path] = {method: _v3_operation(o) for method, o in operations.items()}
        rendered[path]["parameters"] = [
            {
                "description": text,
                "in": "path",
                "name": name,
                "required": True,
                "schema": {"type": "string", "uniqueItems": True},
            }
            for name, text in _path_parameters(path, kind)
        ]
    custom = all(resource.schema is not None for resource in resources)
    return {
        "openapi": "3.0.0",
        "info": {
            "title": "Kubernetes CRD Swagger" if custom else "Kubernetes",
            "version": "v0.1.0" if custom else KUBERNETES_VERSION,
        },
        "paths": rendered,
        "components": {"schemas": dict(sorted(schemas.items())), "securitySchemes": _SECURITY},
    }


def v3_document(catalog: Catalog, key: str) -> Obj | None:
    """The OpenAPI 3 document of one group-version (``api/v1``, ``apis/<group>/<version>``)."""
    resources = _served(catalog).get(key)
    return _v3_document(resources) if resources else None


def v3_documents(catalog: Catalog) -> dict[str, Obj]:
    """Every group-version's OpenAPI 3 document, by its ``/openapi/v3`` key."""
    return {key: _v3_document(resources) for key, resources in _served(catalog).items()}


def _v2_schema(schema: Any) -> Any:
    """An OpenAPI 3 schema as OpenAPI 2 writes it: references to ``#/definitions/``, no
    ``nullable`` (which OpenAPI 2 lacks)."""
    if not isinstance(schema, dict):
        return schema
    converted: Obj = {}
    for key, value in schema.items():
        if key == "nullable":
            continue
        if key == "$ref":
            converted[key] = value.replace(definitions.V3_REFERENCE, _V2_REFERENCE, 1)
        elif key == "properties" and isinstance(value, dict):
            converted[key] = {name: _v2_schema(child) for name, child in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            converted[key] = _v2_schema(value)
        elif key in ("allOf", "anyOf", "oneOf") and isinstance(value, list):
            converted[key] = [_v2_schema(child) for child in value]
        else:
            converted[key] = value
    return converted


def v2_document(catalog: Catalog) -> Obj:
    """One OpenAPI 2 document of every group-version, as ``/openapi/v2`` is."""
    all_schemas: dict[str, Obj] = definitions.meta_definitions("", "v1")
    rendered: Obj = {}
    for resources in _served(catalog).values():
        schemas, paths = _contents(resources)
        all_schemas.update(schemas)
        for path, (kind, operations) in paths.items():
            rendered[path] = {method: _v2_operation(o) for method, o in operations.items()}
            rendered[path]["parameters"] = [
                {
                    "description": text,
                    "in": "path",
                    "name": name,
                    "required": True,
                    "type": "string",
                    "uniqueItems": True,
                }
                for name, text in _path_parameters(path, kind)
            ]
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": KUBERNETES_VERSION},
        "paths": dict(sorted(rendered.items())),
        "definitions": {name: _v2_schema(s) for name, s in sorted(all_schemas.items())},
        "securityDefinitions": _SECURITY,
        "security": [{"BearerToken": []}],
    }


def encode(document: Obj) -> tuple[bytes, str]:
    """A document's bytes and its ETag (upper-case hex SHA-512, as kube-openapi's)."""
    data = json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
    return data, hashlib.sha512(data).hexdigest().upper()


def v3_discovery(documents: dict[str, Obj]) -> Obj:
    return {
        "paths": {
            key: {"serverRelativeURL": f"{V3}/{key}?hash={encode(document)[1]}"}
            for key, document in documents.items()
        }
    }


def _accepts_json(accept: str) -> bool:
    """Whether ``Accept`` lists a type that JSON matches. kube-openapi serves the first
    listed type it has (quality values only order the list); this server has only JSON."""
    media_types = (clause.partition(";")[0].strip().lower() for clause in accept.split(","))
    return not accept.strip() or any(m in (JSON, "application/*", "*/*") for m in media_types)


def _not_modified(if_none_match: str | None, etag: str) -> bool:
    if if_none_match is None:
        return False
    tags = [tag.strip().removeprefix("W/") for tag in if_none_match.split(",")]
    return "*" in tags or f'"{etag}"' in tags


def _document(
    request: web.Request, document: Obj, *, negotiated: bool = True, hash_path: str = ""
) -> web.Response:
    """``document`` as JSON, with its ETag, answering ``If-None-Match``; with ``hash_path``,
    its ``hash`` parameter checked (301 when stale) and the answer cacheable for good."""
    if negotiated and not _accepts_json(request.headers.get("Accept", "")):
        return web.Response(status=406, headers={"Vary": "Accept"})
    data, etag = encode(document)
    headers = {"Etag": f'"{etag}"', "Vary": "Accept"}
    requested = request.query.get("hash", "") if hash_path else ""
    if requested and requested != etag:
        location = f"{V3}/{hash_path}?hash={etag}"
        headers.update({"Location": location, "Content-Type": "text/html; charset=utf-8"})
        return web.Response(
            status=301, body=f'<a href="{location}">Moved Permanently</a>.\n\n', headers=headers
        )
    if requested:
        expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=365)
        headers["Cache-Control"] = "public, immutable"
        headers["Expires"] = email.utils.format_datetime(expires, usegmt=True)
    if _not_modified(request.headers.get("If-None-Match"), etag):
        return web.Response(status=304, headers=headers)
    return web.Response(body=data, headers={**headers, "Content-Type": JSON})


def serve(request: web.Request, catalog: Catalog) -> web.Response:
    """Answer a GET under ``/openapi``."""
    path = request.path
    if path == V2:
        return _document(request, v2_document(catalog))
    if path == V3:
        # kube-aggregator serves the discovery document whatever the Accept header says.
        return _document(request, v3_discovery(v3_documents(catalog)), negotiated=False)
    if path.startswith(f"{V3}/"):
        key = path.removeprefix(f"{V3}/")
        document = v3_document(catalog, key)
        if document is None:
            return web.Response(status=404)  # kube-aggregator's: no body
        return _document(request, document, hash_path=key)
    raise errors.path_not_found()
