"""Keeps the ``node.kubernetes.io/unschedulable`` taint in step with ``spec.unschedulable``.

A real control plane taints a cordoned node ``node.kubernetes.io/unschedulable:NoSchedule``
and removes the taint on uncordon. This observer does the same, in a write of its own
after the cordon, so that code editing ``spec.taints`` meets the same extra write (and
resourceVersion bump) it would meet on a real cluster.
"""

from __future__ import annotations

from typing import Any

from gpuop_sim.apiserver import kinds
from gpuop_sim.apiserver.registry import Registry
from gpuop_sim.apiserver.store import Change

Obj = dict[str, Any]

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def _is_unschedulable_taint(taint: Obj) -> bool:
    return taint.get("key") == UNSCHEDULABLE_TAINT and taint.get("effect") == "NoSchedule"


class UnschedulableTaintController:
    """Adds or removes the unschedulable taint after a node's cordon state changes."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        registry.store.observe(self._on_change)

    def _on_change(self, change: Change) -> None:
        if change.resource != kinds.NODES.group_resource or change.type == "DELETED":
            return
        node = change.object
        spec = node.get("spec") or {}
        cordoned = bool(spec.get("unschedulable"))
        tainted = any(_is_unschedulable_taint(t) for t in spec.get("taints") or [])
        if cordoned == tainted:
            return

        def retaint(obj: Obj) -> None:
            obj_spec = obj.setdefault("spec", {})
            taints = [t for t in obj_spec.get("taints") or [] if not _is_unschedulable_taint(t)]
            if cordoned:
                taints.append({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"})
            if taints:
                obj_spec["taints"] = taints
            else:
                obj_spec.pop("taints", None)

        self.registry.mutate(kinds.NODES, "", node["metadata"]["name"], retaint, validate=False)
