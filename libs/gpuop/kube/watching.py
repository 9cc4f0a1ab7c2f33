"""List+watch of any collection, resumed after every disconnect, relisted on 410.

`ListWatch` is what a client-go informer's reflector does, as an async iterator: it lists
the collection (one ADDED per object), then watches from the list's resourceVersion. When
a watch ends (the server's `timeoutSeconds`, a dropped connection, a server error, a 429)
it reconnects from the last resourceVersion it saw (after a backoff, or the Retry-After
the server asked for, when it failed), which BOOKMARK events keep fresh even when
nothing it watches changes. When that version has left the server's history (410 Expired,
as an in-stream ERROR event or an HTTP 410), it lists again and emits the difference to
what it knew: ADDED and MODIFIED for what is new or changed, DELETED for what vanished,
all marked `resync`; so a consumer sees every object's final state and every deletion,
even for changes made while it could not watch. It keeps the last known state of every
object (`objects`) to compute that difference.

Used by the services' controllers (nodes, pods, the cluster policy), by `draining` (a
node's pods: `list()` to plan, the watch to wait until the evicted ones are gone) and by
`customobjects.watch`. Close it (`async with`) to release the connection.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

import aiohttp

from gpuop import lifecycles
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.kube import errors
from gpuop.kube.client import ApiMethod, Kube

Obj = dict[str, Any]
ObjectKey = tuple[str, str]
"""(namespace, name); the namespace is empty for cluster-scoped objects."""
EventType = Literal["ADDED", "MODIFIED", "DELETED"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatchEvent:
    """One change of one object, as the server reported it or as a relist inferred it."""

    type: EventType
    object: Obj
    """The object after the change; for DELETED, its last known state."""
    resync: bool = False
    """True when a relist after 410 inferred this event instead of the watch reporting it:
    changes made while the watch was expired arrive collapsed, one event per object."""


def object_key(obj: Mapping[str, Any]) -> ObjectKey:
    metadata = obj.get("metadata") or {}
    return (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))


def _resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


class ListWatch(lifecycles.Closable):
    """Every change of a collection, in order, across reconnects and expired histories.

    `list_method` is any list method of the official client, with its leading positional
    arguments: `ListWatch(kube, kube.core.list_node)`,
    `ListWatch(kube, kube.core.list_namespaced_pod, "default", label_selector="app=x")`,
    `ListWatch(kube, kube.custom_objects.list_cluster_custom_object, group, version, plural)`.
    """

    def __init__(
        self,
        kube: Kube,
        list_method: ApiMethod,
        *args: Any,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
        retry_delay: float = 0.5,
        max_retry_delay: float = 30.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._kube = kube
        self._list = list_method
        self._args = args
        self._selectors = {
            key: value
            for key, value in (
                ("label_selector", label_selector),
                ("field_selector", field_selector),
            )
            if value
        }
        self._timeout_seconds = timeout_seconds
        self._retry_delay = retry_delay
        self._max_retry_delay = max_retry_delay
        self._clock = clock
        self._objects: dict[ObjectKey, Obj] = {}
        self._pending: deque[WatchEvent] = deque()
        self._resource_version: str | None = None
        self._listed = False
        self._response: aiohttp.ClientResponse | None = None
        self._failures = 0
        self._closed = False

    @property
    def resource_version(self) -> str | None:
        """The version the next watch resumes from; None until listed, and after a 410."""
        return self._resource_version

    @property
    def objects(self) -> Mapping[ObjectKey, Obj]:
        """The last known state of every object, as received; it may run ahead of the events
        not yet taken from the iterator."""
        return MappingProxyType(self._objects)

    async def list(self) -> Mapping[ObjectKey, Obj]:
        """List the collection unless it was listed already, and return every object as last
        known, without waiting for a change; the list's ADDED events still come from the
        iterator, which goes on to watch from there. A failed list raises its `KubeError`."""
        if not self._listed:
            await self._relist()
        return self.objects

    def __aiter__(self) -> ListWatch:
        return self

    async def __anext__(self) -> WatchEvent:
        while not self._pending:
            if self._closed:
                raise StopAsyncIteration
            try:
                await self._advance()
            except errors.Expired:
                log.info("watch history expired; relisting")
                self._disconnect()
                self._resource_version = None
            except (aiohttp.ClientError, TimeoutError, OSError, json.JSONDecodeError) as error:
                await self._back_off(errors.unreachable(error))
            except errors.KubeError as error:
                if not error.temporary:
                    raise
                await self._back_off(error)
        return self._pending.popleft()

    async def _advance(self) -> None:
        """Do one step: list, connect, or read one line of the watch."""
        if self._resource_version is None:
            await self._relist()
            return
        if self._response is None:
            self._response = await self._kube.open(
                self._list,
                *self._args,
                watch=True,
                allow_watch_bookmarks=True,
                resource_version=self._resource_version,
                timeout_seconds=self._timeout_seconds,
                _request_timeout=self._timeout_seconds + 30,
                **self._selectors,
            )
        line = await self._response.content.readline()
        if not line:
            self._disconnect()  # the server ended the watch; resume from where it was
            return
        if line.strip():
            self._receive(json.loads(line))
            self._failures = 0

    def _receive(self, event: Mapping[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            raise errors.from_status(int(obj.get("code") or 500), obj)
        if kind in ("ADDED", "MODIFIED"):
            self._objects[object_key(obj)] = obj
            self._pending.append(WatchEvent(kind, obj))
        elif kind == "DELETED":
            self._objects.pop(object_key(obj), None)
            self._pending.append(WatchEvent("DELETED", obj))
        elif kind != "BOOKMARK":
            log.warning("ignoring a watch event of unknown type %r", kind)
        self._resource_version = _resource_version(obj) or self._resource_version

    async def _relist(self) -> None:
        listed = await self._kube.call(self._list, *self._args, **self._selectors)
        kind = str(listed.get("kind") or "").removesuffix("List")
        fresh: dict[ObjectKey, Obj] = {}
        for item in listed.get("items") or []:
            # Items of a list may omit their kind; watch events always carry it.
            item.setdefault("kind", kind)
            item.setdefault("apiVersion", listed.get("apiVersion"))
            fresh[object_key(item)] = item
        resync = self._listed
        for key, obj in fresh.items():
            known = self._objects.get(key)
            if known is None:
                self._pending.append(WatchEvent("ADDED", obj, resync))
            elif _uid(known) != _uid(obj):
                self._pending.append(WatchEvent("DELETED", known, resync))
                self._pending.append(WatchEvent("ADDED", obj, resync))
            elif _resource_version(known) != _resource_version(obj):
                self._pending.append(WatchEvent("MODIFIED", obj, resync))
        for key, known in self._objects.items():
            if key not in fresh:
                self._pending.append(WatchEvent("DELETED", known, resync))
        self._objects = fresh
        self._resource_version = _resource_version(listed)
        self._listed = True
        self._failures = 0

    async def _back_off(self, error: errors.KubeError) -> None:
        self._disconnect()
        delay = min(self._retry_delay * 2**self._failures, self._max_retry_delay)
        if error.retry_after is not None:  # a throttled watch waits as long as it is asked
            delay = min(max(delay, error.retry_after), self._max_retry_delay)
        self._failures += 1
        log.warning("watch failed (%s); retrying in %.1fs", error, delay)
        await self._clock.sleep(delay)

    def _disconnect(self) -> None:
        if self._response is not None:
            self._response.close()
            self._response = None

    async def close(self) -> None:
        self._closed = True
        self._disconnect()
