"""The garbage collector: deletes dependents whose owners are gone.

Observes every removal. Objects whose ``metadata.ownerReferences`` name the removed
object's uid are deleted in the background (pods still terminate gracefully), unless the
owner was deleted with ``propagationPolicy: Orphan`` or the dependent has another owner
still present; in those cases only the dangling reference is dropped. ``Foreground``
deletion is treated as ``Background``.
"""

from __future__ import annotations

from typing import Any

from gpuop_sim.apiserver.deletion import DeleteOptions
from gpuop_sim.apiserver.registry import Registry
from gpuop_sim.apiserver.store import Change

Obj = dict[str, Any]


class GarbageCollector:
    """Background cascading deletion by ``ownerReferences``."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        registry.store.observe(self._on_change)

    def _on_change(self, change: Change) -> None:
        if change.type != "DELETED":
            return
        uid = change.object["metadata"].get("uid")
        if not uid:
            return
        orphan = uid in self.registry.orphaned_owners
        self.registry.orphaned_owners.discard(uid)
        store = self.registry.store
        existing_uids: set[str] | None = None
        for group_resource in store.resources():
            resource = self.registry.catalog.storage_type(group_resource)
            if resource is None:
                continue
            for obj in list(store.view(group_resource)):
                metadata = obj["metadata"]
                references = metadata.get("ownerReferences") or []
                if not any(ref.get("uid") == uid for ref in references):
                    continue
                if existing_uids is None:
                    existing_uids = {
                        o["metadata"].get("uid") for r in store.resources() for o in store.view(r)
                    }
                others = [r for r in references if r.get("uid") != uid]
                if orphan or any(r.get("uid") in existing_uids for r in others):

                    def drop(dependent: Obj) -> None:
                        dependent["metadata"]["ownerReferences"] = [
                            r
                            for r in dependent["metadata"].get("ownerReferences") or []
                            if r.get("uid") != uid
                        ]

                    self.registry.mutate(
                        resource,
                        metadata.get("namespace", ""),
                        metadata["name"],
                        drop,
                        validate=False,
                    )
                elif not metadata.get("deletionTimestamp"):
                    self.registry.delete(
                        resource,
                        metadata.get("namespace", ""),
                        metadata["name"],
                        DeleteOptions(propagation_policy="Background"),
                    )
