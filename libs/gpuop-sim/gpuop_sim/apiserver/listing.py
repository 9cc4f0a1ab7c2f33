"""List options from the query string, and list responses with paging.

:class:`ListOptions` parses and validates what list and watch requests share (selectors,
``resourceVersion``/``resourceVersionMatch``, ``limit``/``continue``, the watch flags), with
the 422 errors a real server gives for forbidden combinations. :func:`list_response`
serves a list: the current state, or with ``resourceVersionMatch=Exact`` and for every
page after the first, the state at an earlier version reconstructed from the store's
history, so pages are consistent; an expired continue token gets a real HTTP 410.
Called by the HTTP handlers; ``watching.py`` takes the watch half of the options.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuop_sim.apiserver import errors
from gpuop_sim.apiserver.errors import FieldError
from gpuop_sim.apiserver.registry import Registry
from gpuop_sim.apiserver.resources import ResourceType
from gpuop_sim.apiserver.selectors import FieldSelector, LabelSelector

Obj = dict[str, Any]

CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted "
    "between the time the first chunk was returned and now may show up in the list."
)


def flag(query: Mapping[str, str], name: str) -> bool | None:
    """A boolean query parameter as the API server converts it: ``0`` and any case of
    ``false`` are false, every other value (``True``, ``1``, empty) is true."""
    if name not in query:
        return None
    value = query[name]
    return not (value == "0" or value.lower() == "false")


def integer(query: Mapping[str, str], name: str) -> int | None:
    if name not in query or query[name] == "":
        return None
    try:
        return int(query[name])
    except ValueError:
        raise errors.bad_request(f"invalid value for {name}: {query[name]!r}") from None


@dataclass(frozen=True)
class ListOptions:
    namespace: str | None
    label_selector: LabelSelector
    field_selector: FieldSelector
    resource_version: str
    resource_version_match: str
    limit: int
    continue_token: str
    watch: bool
    allow_bookmarks: bool
    send_initial_events: bool | None
    timeout_seconds: int | None

    @staticmethod
    def from_query(
        query: Mapping[str, str], resource: ResourceType, namespace: str | None
    ) -> ListOptions:
        options = ListOptions(
            namespace=namespace,
            label_selector=LabelSelector.parse(query.get("labelSelector", "")),
            field_selector=FieldSelector.parse(
                query.get("fieldSelector", ""), resource.field_labels
            ),
            resource_version=query.get("resourceVersion", ""),
            resource_version_match=query.get("resourceVersionMatch", ""),
            limit=max(integer(query, "limit") or 0, 0),
            continue_token=query.get("continue", ""),
            watch=bool(flag(query, "watch")),
            allow_bookmarks=bool(flag(query, "allowWatchBookmarks")),
            send_initial_events=flag(query, "sendInitialEvents"),
            timeout_seconds=integer(query, "timeoutSeconds"),
        )
        if options.resource_version and not options.resource_version.isdigit():
            raise errors.bad_request(f"invalid resource version {options.resource_version!r}")
        found = options._watch_errors() if options.watch else options._list_errors()
        if found:
            raise errors.invalid("ListOptions", "meta.k8s.io", "", found)
        return options

    def _watch_errors(self) -> list[FieldError]:
        found: list[FieldError] = []
        match = self.resource_version_match
        if self.send_initial_events is not None:
            if match != "NotOlderThan":
                found.append(
                    FieldError.forbidden(
                        "resourceVersionMatch",
                        "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                    )
                )
            if self.send_initial_events and not self.allow_bookmarks:
                found.append(
                    FieldError.forbidden(
                        "allowWatchBookmarks",
                        "allowWatchBookmarks must be set to true when sendInitialEvents is set",
                    )
                )
        if match:
            if self.send_initial_events is None:
                found.append(
                    FieldError.forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden for watch unless sendInitialEvents is "
                        "provided",
                    )
                )
            if match != "NotOlderThan":
                found.append(
                    FieldError.not_supported("resourceVersionMatch", match, ("NotOlderThan",))
                )
        return found

    def _list_errors(self) -> list[FieldError]:
        found: list[FieldError] = []
        if self.send_initial_events is not None:
            found.append(
                FieldError.forbidden("sendInitialEvents", "sendInitialEvents is forbidden for list")
            )
        match = self.resource_version_match
        if match in ("Exact", "NotOlderThan"):
            if not self.resource_version:
                found.append(
                    FieldError.forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden unless resourceVersion is provided",
                    )
                )
            if self.continue_token:
                found.append(
                    FieldError.forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden when continue is provided",
                    )
                )
            if match == "Exact" and self.resource_version == "0":
                found.append(
                    FieldError.forbidden(
                        "resourceVersionMatch",
                        'resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                    )
                )
        elif match:
            found.append(
                FieldError.not_supported("resourceVersionMatch", match, ("Exact", "NotOlderThan"))
            )
        return found

    def matches(self, obj: Obj) -> bool:
        metadata = obj.get("metadata", {})
        if self.namespace is not None and metadata.get("namespace", "") != self.namespace:
            return False
        return self.label_selector.matches(obj) and self.field_selector.matches(obj)


def _encode_continue(resource_version: int, start: str) -> str:
    token = {"v": "meta.k8s.io/v1", "rv": resource_version, "start": start}
    return base64.urlsafe_b64encode(json.dumps(token).encode()).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, str]:
    try:
        padded = token + "=" * (-len(token) % 4)
        decoded = json.loads(base64.urlsafe_b64decode(padded))
        return int(decoded["rv"]), str(decoded["start"])
    except (ValueError, KeyError, TypeError):
        raise errors.bad_request(f"continue key is not valid: {token!r}") from None


def _key(obj: Obj) -> tuple[str, str]:
    metadata = obj["metadata"]
    return (metadata.get("namespace", ""), metadata["name"])


def list_response(registry: Registry, resource: ResourceType, options: ListOptions) -> Obj:
    """The ``<Kind>List`` a GET on a collection answers."""
    store = registry.store
    start = ""
    if options.continue_token:
        version, start = _decode_continue(options.continue_token)
        try:
            objects = store.snapshot(resource.group_resource, version)
        except errors.ApiError:
            raise errors.expired(CONTINUE_EXPIRED) from None
    elif options.resource_version_match == "Exact":
        version = int(options.resource_version)
        objects = store.snapshot(resource.group_resource, version)
    else:
        version = store.resource_version
        objects = store.items(resource.group_resource, options.namespace)
    after = tuple(start.split("/", 1)) if start else None
    items = [
        obj for obj in objects if options.matches(obj) and (after is None or _key(obj) > after)
    ]
    for item in items:
        item["apiVersion"], item["kind"] = resource.api_version, resource.kind
    metadata: Obj = {"resourceVersion": str(version)}
    # A list served "from cache" (resourceVersion=0) ignores limit, as a real server does.
    if options.limit and options.resource_version != "0" and len(items) > options.limit:
        remaining = len(items) - options.limit
        items = items[: options.limit]
        metadata["continue"] = _encode_continue(version, "/".join(_key(items[-1])))
        if not options.label_selector.requirements and not options.field_selector.terms:
            metadata["remainingItemCount"] = remaining
    return {
        "kind": resource.list_kind,
        "apiVersion": resource.api_version,
        "metadata": metadata,
        "items": items,
    }
