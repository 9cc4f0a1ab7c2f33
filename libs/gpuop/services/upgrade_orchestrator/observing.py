"""Kubernetes node observations, recorded as events before the decision core sees them.

`NodeWatcher` list-watches the GPU nodes (label `GPU_NODE_SELECTOR`) and, whenever what the
saga or admission cares about changes (Ready, `spec.unschedulable`, the kubelet's boot id,
the node skip labels), publishes `kube.NodeObserved`; a deleted node yields
`kube.NodeRemoved`. Event ids derive from the node's uid and resourceVersion, so two replicas
seeing the same change store it once. It also keeps each node's `NodeStatus` for the
admission pass (with the components its skip labels keep out, `admission.skipped_by`) and
its labels for the policy's `nodeSelector`, and calls `on_change` so the controller
reconciles at once. The skip labels reach the sagas only through admission, which records
what it made of them in `NodeAdmitted`; the observation carries them so the log shows why a
node waited. The executor cordons and uncordons from the watch's copy of the node (`node`)
instead of reading it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from gpuop.bus import Bus
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events import ids
from gpuop.events import kube as observed
from gpuop.events.driver import Component
from gpuop.kube import client, nodes
from gpuop.kube.watching import ListWatch
from gpuop.saga import NodeStatus, admission
from gpuop.saga.remediation.actions import REPLACEMENT_LABEL
from gpuop.services.upgrade_orchestrator.publishing import Publisher

log = logging.getLogger(__name__)

GPU_NODE_SELECTOR = "nvidia.com/gpu.present=true"
"""The nodes a rollout manages."""
LABEL_PREFIXES = ("gpuop.io/", "nvidia.com/gpu-driver-upgrade", "nvidia.com/ofed-driver-upgrade")
"""Labels copied into `NodeObserved` (the ones gpuop acts on)."""


def is_ready(node: Mapping[str, Any]) -> bool:
    """The node's Ready condition is True."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def boot_id_of(node: Mapping[str, Any]) -> str | None:
    """`status.nodeInfo.bootID`, when the kubelet reported one."""
    boot_id = ((node.get("status") or {}).get("nodeInfo") or {}).get("bootID")
    return str(boot_id) if boot_id else None


def observation(node: Mapping[str, Any]) -> observed.NodeObserved:
    """What the saga needs to know of `node`."""
    labels = {
        key: value for key, value in nodes.labels_of(node).items() if key.startswith(LABEL_PREFIXES)
    }
    return observed.NodeObserved(
        ready=is_ready(node),
        unschedulable=nodes.is_unschedulable(node),
        boot_id=boot_id_of(node),
        labels=dict(sorted(labels.items())[:64]),
    )


_Facts = tuple[bool, bool, str | None, frozenset[Component], str | None]


def _facts(seen: observed.NodeObserved, status: NodeStatus) -> _Facts:
    # the replacement label is a fact: a repair flow releases a node held for new hardware
    # by setting it, and the remediation waits for nothing else
    replacement = seen.labels.get(REPLACEMENT_LABEL)
    return (seen.ready, seen.unschedulable, seen.boot_id, status.skip, replacement)


class NodeWatcher:
    """Publishes node observations and keeps the admission view of every GPU node."""

    def __init__(
        self,
        bus: Bus,
        kube: client.Kube,
        *,
        on_change: Callable[[], None] = lambda: None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._publish = Publisher(bus, clock)
        self._kube = kube
        self._on_change = on_change
        self._clock = clock
        self._seen: dict[str, _Facts] = {}
        self.statuses: dict[str, NodeStatus] = {}
        """Node name -> what admission needs of it."""
        self.labels: dict[str, dict[str, str]] = {}
        """Node name -> its labels, as last seen."""
        self.synced = False
        """The initial list has been processed."""
        self._watch: ListWatch | None = None

    def node(self, name: str) -> Mapping[str, Any] | None:
        """The GPU node as the watch last saw it (a moment behind the API server at most)."""
        return None if self._watch is None else self._watch.objects.get(("", name))

    async def run(self) -> None:
        """Watch until cancelled."""
        async with ListWatch(
            self._kube, self._kube.core.list_node, label_selector=GPU_NODE_SELECTOR,
            clock=self._clock,
        ) as watch:  # fmt: skip
            self._watch = watch
            async for change in watch:
                node = change.object
                name = str(node["metadata"]["name"])
                if change.type == "DELETED":
                    await self._removed(name, node)
                else:
                    await self._observed(name, node)
                # the initial list arrives as one ADDED per node: admit only once all are in
                self.synced = self.synced or len(self.statuses) >= len(watch.objects)
                self._on_change()

    async def _observed(self, name: str, node: Mapping[str, Any]) -> None:
        seen = observation(node)
        self.labels[name] = labels = nodes.labels_of(node)
        self.statuses[name] = status = NodeStatus(
            ready=seen.ready,
            unschedulable=seen.unschedulable,
            skip=admission.skipped_by(labels),
            labels=labels,
        )
        facts = _facts(seen, status)
        if self._seen.get(name) == facts:
            return
        self._seen[name] = facts
        metadata = node["metadata"]
        event_id = ids.node_observed(
            str(metadata.get("uid") or name), f"{metadata.get('resourceVersion')}"
        )
        await self._publish.event(seen, node=name, id=event_id)

    async def _removed(self, name: str, node: Mapping[str, Any]) -> None:
        self.statuses.pop(name, None)
        self.labels.pop(name, None)
        self._seen.pop(name, None)
        uid = str(node["metadata"].get("uid") or name)
        await self._publish.event(observed.NodeRemoved(), node=name, id=ids.node_removed(uid))
