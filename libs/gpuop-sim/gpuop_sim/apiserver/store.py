"""Objects, the global resourceVersion, and the change history behind watches.

The store is the simulated server's etcd: one cluster-wide counter that only increases,
stamped into every object it writes; a bounded history of changes that watches replay
from; and the fan-out of each change to registered watches and in-process observers
(the PDB, CRD, namespace and node controllers). It knows nothing of HTTP or of registry
rules: ``registry.py`` decides what to write, the store records it.

All methods are synchronous and run on the server's event loop, so a watch registered
before its initial state is read can never miss a write in between.
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from gpuop_sim.apiserver import errors
from gpuop_sim.apiserver.resources import GroupResource

Obj = dict[str, Any]
ObjectKey = tuple[str, str]
"""(namespace, name); the namespace is empty for cluster-scoped objects."""

ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Change:
    """One committed write. Objects in a change are shared: never mutate them."""

    type: ChangeType
    resource: GroupResource
    resource_version: int
    object: Obj
    """The object after the write; for DELETED, its last state at the deletion's version."""
    previous: Obj | None
    """The object before the write; None for ADDED."""


class Watcher:
    """A registered watch: receives every change of one resource, in order."""

    def __init__(self, resource: GroupResource) -> None:
        self.resource = resource
        self.queue: asyncio.Queue[Change | None] = asyncio.Queue()
        """Changes in commit order; None means the server ends this watch."""


Observer = Callable[[Change], None]


def object_key(obj: Obj) -> ObjectKey:
    metadata = obj.get("metadata", {})
    return (metadata.get("namespace", ""), metadata["name"])


class Store:
    """Objects by resource, the global resourceVersion, history, watches and observers."""

    def __init__(self, *, history_limit: int = 100_000) -> None:
        self._objects: dict[GroupResource, dict[ObjectKey, Obj]] = {}
        self._revision = 0
        self._history: list[Change] = []
        self._history_revisions: list[int] = []
        self._history_limit = history_limit
        self._compacted = 0
        self._watchers: dict[GroupResource, set[Watcher]] = {}
        self._observers: list[Observer] = []
        self._pending: deque[Change] = deque()
        self._notifying = False

    @property
    def resource_version(self) -> int:
        """The version of the latest write anywhere in the cluster."""
        return self._revision

    @property
    def oldest_resource_version(self) -> int:
        """The oldest version a watch can still start from (everything after it is kept)."""
        return self._compacted

    # Reads: callers get copies, so nothing they do can change stored state.

    def get(self, resource: GroupResource, namespace: str, name: str) -> Obj | None:
        stored = self._objects.get(resource, {}).get((namespace, name))
        return copy.deepcopy(stored) if stored is not None else None

    def items(self, resource: GroupResource, namespace: str | None = None) -> list[Obj]:
        return [copy.deepcopy(obj) for obj in self.view(resource, namespace)]

    def view(self, resource: GroupResource, namespace: str | None = None) -> list[Obj]:
        """Stored objects without copying, sorted by key; for controllers that only read."""
        objects = self._objects.get(resource, {})
        return [objects[key] for key in sorted(objects) if namespace is None or key[0] == namespace]

    def resources(self) -> list[GroupResource]:
        return [resource for resource, objects in self._objects.items() if objects]

    # Writes.

    def put(self, resource: GroupResource, obj: Obj) -> Obj:
        """Store ``obj`` under a new resourceVersion; emits ADDED or MODIFIED."""
        key = object_key(obj)
        objects = self._objects.setdefault(resource, {})
        previous = objects.get(key)
        self._revision += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self._revision)
        objects[key] = stored
        self._record(
            Change(
                "ADDED" if previous is None else "MODIFIED",
                resource,
                self._revision,
                stored,
                previous,
            )
        )
        return copy.deepcopy(stored)

    def remove(self, resource: GroupResource, namespace: str, name: str) -> Obj:
        """Remove an object; emits DELETED carrying its last state at the new version."""
        previous = self._objects[resource].pop((namespace, name))
        self._revision += 1
        final = copy.deepcopy(previous)
        final["metadata"]["resourceVersion"] = str(self._revision)
        self._record(Change("DELETED", resource, self._revision, final, previous))
        return copy.deepcopy(final)

    # History.

    def changes_since(self, resource: GroupResource, resource_version: int) -> list[Change]:
        """Every change of ``resource`` after ``resource_version``; 410 if compacted away."""
        if resource_version < self._compacted:
            raise errors.too_old_resource_version(resource_version, self._compacted)
        start = bisect.bisect_right(self._history_revisions, resource_version)
        return [change for change in self._history[start:] if change.resource == resource]

    def snapshot(self, resource: GroupResource, resource_version: int) -> list[Obj]:
        """The objects of ``resource`` as they were at ``resource_version``, sorted by key."""
        if resource_version < self._compacted:
            raise errors.too_old_resource_version(resource_version, self._compacted)
        objects = dict(self._objects.get(resource, {}))
        for change in reversed(self._history):
            if change.resource_version <= resource_version:
                break
            if change.resource != resource:
                continue
            key = object_key(change.object)
            if change.type == "ADDED":
                objects.pop(key, None)
            elif change.previous is not None:
                objects[key] = change.previous
        return [copy.deepcopy(objects[key]) for key in sorted(objects)]

    def compact(self) -> None:
        """Forget all history: watches from any earlier version now get 410 Expired."""
        self._history.clear()
        self._history_revisions.clear()
        self._compacted = self._revision

    # Watches and observers.

    def watch(self, resource: GroupResource) -> Watcher:
        watcher = Watcher(resource)
        self._watchers.setdefault(resource, set()).add(watcher)
        return watcher

    def watch_count(self, resource: GroupResource) -> int:
        """How many watches of ``resource`` are open; lets tests see abandoned ones close."""
        return len(self._watchers.get(resource, ()))

    def stop_watching(self, watcher: Watcher) -> None:
        self._watchers.get(watcher.resource, set()).discard(watcher)

    def close_watchers(self, resource: GroupResource | None = None) -> None:
        """End the watches of one resource (its CRD went away) or of all (shutdown)."""
        for watched, watchers in self._watchers.items():
            if resource is None or watched == resource:
                for watcher in watchers:
                    watcher.queue.put_nowait(None)

    def observe(self, observer: Observer) -> None:
        """Call ``observer`` after every committed change, outside the writer's call chain
        so that an observer's own writes are observed in order, never recursively."""
        self._observers.append(observer)

    def _record(self, change: Change) -> None:
        self._history.append(change)
        self._history_revisions.append(change.resource_version)
        if len(self._history) > self._history_limit:
            dropped = len(self._history) - self._history_limit
            self._compacted = self._history_revisions[dropped - 1]
            del self._history[:dropped]
            del self._history_revisions[:dropped]
        for watcher in self._watchers.get(change.resource, ()):
            watcher.queue.put_nowait(change)
        self._pending.append(change)
        if not self._notifying:
            self._notify()

    def _notify(self) -> None:
        self._notifying = True
        try:
            while self._pending:
                change = self._pending.popleft()
                for observer in self._observers:
                    try:
                        observer(change)
                    except Exception:
                        # A controller bug must not fail the client write that woke it;
                        # the log carries it to the test output.
                        logger.exception("sim controller failed on %s", change.type)
        finally:
            self._notifying = False
