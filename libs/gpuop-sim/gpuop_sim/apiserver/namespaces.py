"""The namespace controller: empties a Terminating namespace, then removes it.

Deleting a namespace only marks it Terminating (``registry.py``); this observer then
deletes everything inside it with ordinary deletes, so pods terminate gracefully and
finalizers hold objects back exactly as they would one at a time, and removes the
namespace once nothing is left in it. Creating in a Terminating namespace is refused
by the registry with 403.
"""

from __future__ import annotations

from gpuop_sim.apiserver import kinds
from gpuop_sim.apiserver.registry import Registry
from gpuop_sim.apiserver.store import Change


class NamespaceController:
    """Finishes namespace deletion."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        registry.store.observe(self._on_change)

    def _on_change(self, change: Change) -> None:
        if change.resource == kinds.NAMESPACES.group_resource:
            if change.type != "DELETED" and change.object["metadata"].get("deletionTimestamp"):
                self._empty(change.object["metadata"]["name"])
        elif change.type == "DELETED":
            namespace = change.object["metadata"].get("namespace")
            if namespace:
                self._remove_if_empty(namespace)

    def _terminating(self, namespace: str) -> bool:
        found = self.registry.store.get(kinds.NAMESPACES.group_resource, "", namespace)
        return found is not None and bool(found["metadata"].get("deletionTimestamp"))

    def _empty(self, namespace: str) -> None:
        for resource in self.registry.catalog.storage_types():
            if not resource.namespaced:
                continue
            for obj in list(self.registry.store.view(resource.group_resource, namespace)):
                if not obj["metadata"].get("deletionTimestamp"):
                    self.registry.delete(resource, namespace, obj["metadata"]["name"])
        self._remove_if_empty(namespace)

    def _remove_if_empty(self, namespace: str) -> None:
        if not self._terminating(namespace):
            return
        store = self.registry.store
        if any(store.view(resource, namespace) for resource in store.resources()):
            return
        store.remove(kinds.NAMESPACES.group_resource, "", namespace)
