"""HTTP request handling: URL layout, verbs, bodies and responses.

Resolves a request path the way the API server's RequestInfo does (``/api/v1/...`` and
``/apis/{group}/{version}/...``, ``namespaces/{ns}/{plural}/{name}/{subresource}``,
cluster-wide collections of namespaced resources, ``namespaces/{ns}/status`` as the
namespace's own subresource), picks the verb, decodes the body and query, and calls the
registry, ``listing``, ``watching``, ``eviction``, ``reviews`` (the access reviews, for the
user ``server.py`` authenticated) or ``discovery``; ``/openapi/...`` goes to ``openapi``.
Every response is JSON with exactly ``Content-Type: application/json``, but for the bodies
``/openapi`` leaves empty. Called by ``server.py``'s single route.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml
from aiohttp import web

from gpuop_sim.apiserver import (
    applying,
    discovery,
    errors,
    eviction,
    listing,
    openapi,
    patching,
    protobufs,
    reviews,
    watching,
)
from gpuop_sim.apiserver.authorizing import Authorizer, User
from gpuop_sim.apiserver.deletion import DeleteOptions
from gpuop_sim.apiserver.listing import ListOptions, flag, integer
from gpuop_sim.apiserver.registry import Registry
from gpuop_sim.apiserver.resources import ResourceType

Obj = dict[str, Any]

JSON = "application/json"
_BODY_TYPES = (JSON, "application/yaml")
# aiohttp reports a missing Content-Type as octet-stream; clients that omit it send JSON.
_JSON_LIKE = frozenset({JSON, "application/octet-stream", "*/*", ""})
USER = web.RequestKey("user", User)
"""Where ``server.py`` leaves the request's authenticated :class:`User`."""


def json_response(
    body: Obj, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """A JSON response whose Content-Type has no charset parameter, as lightkube requires."""
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(),
        status=status,
        headers={"Content-Type": JSON, **(headers or {})},
    )


def error_response(error: errors.ApiError) -> web.Response:
    headers = {"Retry-After": str(error.retry_after_seconds)} if error.retry_after_seconds else {}
    return json_response(error.status(), error.code, headers)


@dataclass(frozen=True)
class Target:
    """What a resource URL names."""

    resource: ResourceType
    namespace: str | None
    """None for cluster-scoped resources and for lists across all namespaces."""
    name: str | None
    subresource: str | None


class Handlers:
    """Serves the Kubernetes REST API from a registry."""

    def __init__(
        self,
        registry: Registry,
        authorizer: Authorizer,
        *,
        bookmark_interval: float,
        server_address: Callable[[], str],
        watch_opened: watching.WatchOpened | None = None,
    ) -> None:
        self.registry = registry
        self.authorizer = authorizer
        self.bookmark_interval = bookmark_interval
        self.server_address = server_address
        self.watch_opened = watch_opened

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok", content_type="text/plain")
        if request.method != "GET" and not path.startswith(("/api/", "/apis/")):
            raise errors.method_not_allowed()
        parts = [part for part in path.split("/") if part]
        if path in ("/version", "/version/"):
            return json_response(discovery.version())
        if path == "/openapi" or path.startswith("/openapi/"):
            return openapi.serve(request, self.registry.catalog)
        if parts == ["api"]:
            return json_response(discovery.core_versions(self.server_address()))
        if parts == ["apis"]:
            return json_response(discovery.group_list(self.registry.catalog))
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 2 and parts[0] == "apis":
            if len(parts) == 2:
                found = discovery.group(self.registry.catalog, parts[1])
                if found is None:
                    raise errors.path_not_found()
                return json_response(found)
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise errors.path_not_found()
        if not rest:
            listed = discovery.resource_list(self.registry.catalog, group, version)
            if listed is None or request.method != "GET":
                raise errors.path_not_found()
            return json_response(listed)
        target = self._resolve(group, version, rest)
        if target.resource.virtual:
            return await self._review(request, target)
        if target.name is None:
            return await self._collection(request, target)
        if target.subresource == "eviction":
            if request.method != "POST":
                raise errors.method_not_allowed()
            body = await _read_body(request)
            return json_response(
                eviction.evict(self.registry, target.namespace or "", target.name, body), 201
            )
        return await self._object(request, target, target.name)

    async def _review(self, request: web.Request, target: Target) -> web.StreamResponse:
        """Create an access review: the only verb its resource has."""
        if target.name is not None:
            raise errors.path_not_found()
        if request.method != "POST":
            raise errors.method_not_allowed()
        user = request[USER]
        body = await _read_body(request)
        answer = reviews.review(self.authorizer, user, target.resource, target.namespace, body)
        return json_response(answer, 201)

    def _resolve(self, group: str, version: str, rest: list[str]) -> Target:
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
            namespace, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise errors.path_not_found()
        resource = self.registry.catalog.lookup(group, version, rest[0])
        if resource is None or (namespace is not None and not resource.namespaced):
            raise errors.path_not_found()
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        if resource.namespaced and name is not None and namespace is None:
            raise errors.path_not_found()
        if subresource is not None and subresource not in resource.subresources:
            raise errors.path_not_found()
        return Target(resource, namespace, name, subresource)

    async def _collection(self, request: web.Request, target: Target) -> web.StreamResponse:
        resource, namespace = target.resource, target.namespace
        query = dict(request.query)
        if request.method == "GET":
            options = ListOptions.from_query(query, resource, namespace)
            if options.watch:
                return await watching.serve_watch(
                    request,
                    self.registry.store,
                    resource,
                    options,
                    bookmark_interval=self.bookmark_interval,
                    on_open=self.watch_opened,
                )
            return json_response(listing.list_response(self.registry, resource, options))
        if request.method == "POST":
            if resource.namespaced and namespace is None:
                raise errors.method_not_allowed()
            body = await _read_body(request)
            created = self.registry.create(
                resource,
                namespace or "",
                body,
                dry_run=_dry_run(query),
                manager=_manager(request, query),
            )
            return json_response(created, 201)
        if request.method == "DELETE":
            options = ListOptions.from_query(query, resource, namespace)
            delete_options = await _delete_options(request, query)
            deleted = []
            for obj in listing.list_response(self.registry, resource, options)["items"]:
                metadata = obj["metadata"]
                outcome = self.registry.delete(
                    resource, metadata.get("namespace", ""), metadata["name"], delete_options
                )
                deleted.append(outcome.object)
            listed = {
                "kind": resource.list_kind,
                "apiVersion": resource.api_version,
                "metadata": {"resourceVersion": str(self.registry.store.resource_version)},
                "items": deleted,
            }
            return json_response(listed)
        raise errors.method_not_allowed()

    async def _object(self, request: web.Request, target: Target, name: str) -> web.StreamResponse:
        resource, namespace = target.resource, target.namespace or ""
        query = dict(request.query)
        method = request.method
        if method == "GET":
            return json_response(self.registry.get(resource, namespace, name))
        if method == "PUT":
            body = await _read_body(request)
            updated = self.registry.update(
                resource,
                namespace,
                name,
                body,
                subresource=target.subresource,
                dry_run=_dry_run(query),
                manager=_manager(request, query),
            )
            return json_response(updated)
        if method == "PATCH" and request.content_type == patching.APPLY_PATCH:
            return await self._apply(request, target, name, query)
        if method == "PATCH":
            raw = await request.read()
            try:
                patch = json.loads(raw or b"null")
            except ValueError as error:
                raise errors.bad_request(f"error decoding patch: {error}") from None
            patched = self.registry.patch(
                resource,
                namespace,
                name,
                request.content_type,
                patch,
                subresource=target.subresource,
                dry_run=_dry_run(query),
                manager=_manager(request, query),
            )
            return json_response(patched)
        if method == "DELETE" and target.subresource is None:
            options = await _delete_options(request, query)
            outcome = self.registry.delete(resource, namespace, name, options)
            if outcome.removed and not resource.return_deleted_object:
                details: Obj = {"name": name, "group": resource.group, "kind": resource.plural}
                details["uid"] = outcome.object["metadata"].get("uid", "")
                return json_response(
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Success",
                        "details": details,
                    }
                )
            return json_response(outcome.object)
        raise errors.method_not_allowed()

    async def _apply(
        self, request: web.Request, target: Target, name: str, query: dict[str, str]
    ) -> web.StreamResponse:
        """Server-side apply: a YAML (or JSON) configuration, by the query's fieldManager."""
        manager = query.get("fieldManager")
        if not manager:
            raise applying.manager_required()
        raw = await request.read()
        try:
            body = yaml.safe_load(raw)
        except yaml.YAMLError as error:
            raise errors.bad_request(f"error encoding patch: {_yaml_problem(error)}") from None
        applied, created = self.registry.apply(
            target.resource,
            target.namespace or "",
            name,
            body,
            manager=manager,
            force=_force(query),
            subresource=target.subresource,
            dry_run=_dry_run(query),
        )
        return json_response(applied, 201 if created else 200)


def _force(query: dict[str, str]) -> bool:
    """``force`` as Go's query decoding reads a bool: anything but 0 and false is true."""
    value = query.get("force", "")
    return value != "" and value != "0" and value.lower() != "false"


def _yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML error in the words of Go's yaml package: ``yaml: line 2: <problem>``."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    return f"yaml: line {mark.line + 1}: {problem}" if mark is not None else f"yaml: {problem}"


def _manager(request: web.Request, query: dict[str, str]) -> str:
    """The manager of an Update: the query's fieldManager, else, as upstream, the
    User-Agent up to its first '/'."""
    return query.get("fieldManager") or request.headers.get("User-Agent", "").split("/")[0]


def _dry_run(query: dict[str, str]) -> bool:
    return query.get("dryRun") == "All"


async def _read_body(request: web.Request) -> Obj:
    raw = await request.read()
    content_type = request.content_type
    if content_type == protobufs.MEDIA_TYPE:
        return protobufs.decode(raw)
    if content_type not in _JSON_LIKE and content_type not in _BODY_TYPES:
        raise errors.unsupported_media_type(_BODY_TYPES)
    try:
        body = yaml.safe_load(raw) if content_type == "application/yaml" else json.loads(raw)
    except (ValueError, yaml.YAMLError) as error:
        raise errors.bad_request(f"the body of the request could not be decoded: {error}") from None
    if not isinstance(body, dict):
        raise errors.bad_request("the body of the request must be a JSON object")
    return body


async def _delete_options(request: web.Request, query: dict[str, str]) -> DeleteOptions:
    """Delete options from the body, with query parameters filling what it leaves out."""
    raw = await request.read()
    body: Obj = {}
    if raw.strip():
        try:
            decoded = json.loads(raw)
        except ValueError as error:
            raise errors.bad_request(f"error decoding DeleteOptions: {error}") from None
        if isinstance(decoded, dict):
            body = decoded
    if (
        "gracePeriodSeconds" not in body
        and (grace := integer(query, "gracePeriodSeconds")) is not None
    ):
        body["gracePeriodSeconds"] = grace
    if "propagationPolicy" not in body and "propagationPolicy" in query:
        body["propagationPolicy"] = query["propagationPolicy"]
    if "orphanDependents" not in body and (orphan := flag(query, "orphanDependents")) is not None:
        body["orphanDependents"] = orphan
    if "dryRun" not in body and _dry_run(query):
        body["dryRun"] = ["All"]
    return DeleteOptions.from_body(body)
