"""Requests served, counted the way kube-apiserver's `apiserver_request_total` counts them.

The server (``server.py``) classifies every request as its response starts and adds one to
``ApiServer.requests[RequestKind(verb, resource, scope)]``, so a test or a benchmark can
read how many requests of each kind a client made, e.g. the API cost of one upgraded node:

- ``verb``: ``GET``, ``LIST``, ``WATCH``, ``POST``, ``PUT``, ``PATCH``, ``DELETE`` or
  ``DELETECOLLECTION``; a GET of a collection is a LIST, or a WATCH with ``watch=true``;
- ``resource``: the plural, with the subresource after a slash (``pods``,
  ``pods/eviction``, ``gpuclusterpolicies/status``); for a URL that names no resource
  (discovery, ``/version``) the path itself;
- ``scope``: ``resource`` (one named object), ``namespace`` (a collection in one
  namespace), ``cluster`` (a collection across all namespaces, or of a cluster-scoped
  resource), or ``nonresource``.

A cluster-scoped LIST of pods is one whose every answer grows with the cluster; the
request log (``ApiServer.request_log``) keeps the query when the selector matters.
"""

from __future__ import annotations

from typing import NamedTuple

from gpuop_sim.apiserver.listing import flag


class RequestKind(NamedTuple):
    """What a request asked for: one counter of ``ApiServer.requests``."""

    verb: str
    resource: str
    scope: str


_OBJECT_VERBS = {"GET": "GET", "PUT": "PUT", "PATCH": "PATCH", "DELETE": "DELETE", "POST": "POST"}
_COLLECTION_VERBS = {"POST": "POST", "DELETE": "DELETECOLLECTION", "PUT": "PUT", "PATCH": "PATCH"}


def classify(method: str, path: str, query: dict[str, str]) -> RequestKind:
    """The kind of a request, from its method, path and query (see the module docstring)."""
    parts = [part for part in path.split("/") if part]
    if parts[:2] == ["api", "v1"]:
        rest = parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        rest = parts[3:]
    else:
        rest = []
    if not rest:
        return RequestKind(method, path, "nonresource")
    namespaced = (
        rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize")
    )
    if namespaced:
        rest = rest[2:]
    resource = "/".join((rest[0], *rest[2:3]))
    if len(rest) == 1:
        if method == "GET":
            verb = "WATCH" if flag(query, "watch") else "LIST"
        else:
            verb = _COLLECTION_VERBS.get(method, method)
        return RequestKind(verb, resource, "namespace" if namespaced else "cluster")
    return RequestKind(_OBJECT_VERBS.get(method, method), resource, "resource")
