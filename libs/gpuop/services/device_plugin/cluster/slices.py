"""The DRA nodes' ResourceSlices, written from their inventories; called by the cluster role.

`SlicePublisher` keeps, per node, the latest inventory (`hardware.discovered`, or the
`gpuop_nodes` bucket at start) and the latest `device.api-applied`. A node whose latest
answer says `api=dra, serving=true` gets one pool named after it (`dra_devices`); any other
node gets none: its slices are deleted, and the kubelet's own wipe (at its start, and 30 s
after the plugin went away) is not fought. `sync(node)` reads the node's slices and makes
them what the inventory says: obsolete ones deleted, changed ones replaced, missing ones
created, every write carrying what it was decided on (a replace the read resourceVersion, a
delete the uid and resourceVersion), so on a 409 it reads and decides again. When the
devices change, every slice of the pool gets a higher `pool.generation`; a pool wiped and
made again continues from the generation this process last wrote.

A Node that does not exist has no slices (its slices' ownerReference lets Kubernetes' garbage
collector take them when it goes; `sync` deletes any left). The Node's uid is read for the
ownerReference at every sync.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuop.events.device_api_commands import DeviceApi, DeviceApiApplied
from gpuop.events.dra import DRIVER
from gpuop.events.hardware import HardwareDiscovered
from gpuop.inventory import dra_devices
from gpuop.kube import dra, errors, nodes
from gpuop.kube.client import Kube

log = logging.getLogger(__name__)

Obj = dict[str, Any]

CONFLICT_ATTEMPTS = 5
"""Fresh reads one `sync` makes after conflicts before it gives up (`SliceConflict`)."""


class SliceConflict(Exception):
    """The node's slices kept changing under every decision; sync it again later."""


@dataclass
class NodeState:
    """What the cluster role knows of one node."""

    inventory: HardwareDiscovered | None = None
    inventory_time: datetime | None = None
    api: DeviceApiApplied | None = None
    api_time: datetime | None = None
    generation: int = 0
    """The highest pool generation this process wrote or saw."""
    written: set[str] = field(default_factory=set)
    """resourceVersions of the slices this process wrote last, so their watch events do
    not wake a sync of their own."""

    @property
    def serves_dra(self) -> bool:
        return self.api is not None and self.api.api is DeviceApi.DRA and self.api.serving


class SlicePublisher:
    """Writes each DRA node's pool; one instance per cluster role."""

    def __init__(self, kube: Kube) -> None:
        self._kube = kube
        self.nodes: dict[str, NodeState] = {}

    def state(self, node: str) -> NodeState:
        return self.nodes.setdefault(node, NodeState())

    def inventory(self, node: str, inventory: HardwareDiscovered, at: datetime) -> bool:
        """Take a node's inventory observed at `at`; False when an older one than known."""
        return self._take(node, "inventory", inventory, at)

    def api_applied(self, node: str, applied: DeviceApiApplied, at: datetime) -> bool:
        """Take a node's `device.api-applied` of `at`; False when an older one than known."""
        return self._take(node, "api", applied, at)

    def _take(self, node: str, what: str, value: object, at: datetime) -> bool:
        state = self.state(node)
        known = getattr(state, f"{what}_time")
        if known is not None and at < known:
            return False
        setattr(state, what, value)
        setattr(state, f"{what}_time", at)
        return True

    def devices(self, node: str) -> tuple[dra_devices.DraDevice, ...]:
        """The devices the node's pool lists now; none unless it serves DRA."""
        state = self.nodes.get(node)
        if state is None or not state.serves_dra or state.inventory is None:
            return ()
        return dra_devices.devices_of(state.inventory)

    def is_own_write(self, obj: Mapping[str, Any]) -> bool:
        """Whether a watched slice is as this process last wrote it."""
        node = str((obj.get("spec") or {}).get("nodeName") or "")
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        state = self.nodes.get(node)
        return state is not None and version in state.written

    async def sync(self, node: str) -> None:
        """Make the node's slices match its state; `SliceConflict` after repeated 409s,
        `KubeError` for anything else."""
        for _ in range(CONFLICT_ATTEMPTS):
            try:
                await self._sync_once(node)
                return
            except errors.Conflict as conflict:
                log.info("slices of node %s changed meanwhile (%s); deciding again", node, conflict)
        raise SliceConflict(f"the slices of node {node} kept changing")

    async def _sync_once(self, node: str) -> None:
        state = self.state(node)
        current = {
            str(s["metadata"]["name"]): s
            for s in await dra.list_slices(self._kube, driver=DRIVER, node=node)
        }
        published = max((_generation(s) for s in current.values()), default=0)
        state.generation = max(state.generation, published)
        wanted_devices = self.devices(node)
        uid = await self._node_uid(node) if state.serves_dra and state.inventory else None
        if uid is None:
            for stale in current.values():
                await dra.delete_slice(self._kube, stale)
            if current:
                log.info("deleted the %d DRA slices of node %s", len(current), node)
            state.written.clear()
            return
        wanted = dra_devices.resource_slices(node, uid, wanted_devices, published)
        if not current or not _unchanged(current, wanted):
            state.generation += 1
            wanted = dra_devices.resource_slices(node, uid, wanted_devices, state.generation)
        names = {str(s["metadata"]["name"]) for s in wanted}
        written: set[str] = set()
        for name, stale in current.items():
            if name not in names:
                await dra.delete_slice(self._kube, stale)
        for body in wanted:
            name = str(body["metadata"]["name"])
            have = current.get(name)
            if have is None:
                stored = await dra.create_slice(self._kube, body)
            elif have.get("spec") != body["spec"] or _owners(have) != _owners(body):
                version = have["metadata"]["resourceVersion"]
                body["metadata"]["resourceVersion"] = version
                stored = await dra.replace_slice(self._kube, body)
            else:
                stored = have
            written.add(str(stored["metadata"]["resourceVersion"]))
        if written != {str(s["metadata"]["resourceVersion"]) for s in current.values()}:
            log.info(
                "published node %s's pool: %d devices in %d slices, generation %d",
                node,
                len(wanted_devices),
                len(wanted),
                state.generation,
            )
        state.written = written

    async def _node_uid(self, node: str) -> str | None:
        """The Node's uid, read at every sync: a slice owned by a Node that is gone would be
        taken by the garbage collector as soon as it was made, and a Node made again under
        the name is another owner. None when there is no such Node."""
        try:
            return str((await nodes.get(self._kube, node))["metadata"]["uid"])
        except errors.NotFound:
            return None


def _generation(slice_: Mapping[str, Any]) -> int:
    return int(((slice_.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def _owners(obj: Mapping[str, Any]) -> list[Any]:
    return list((obj.get("metadata") or {}).get("ownerReferences") or [])


def _unchanged(current: Mapping[str, Obj], wanted: list[Obj]) -> bool:
    """Whether the pool lists the same devices in the same slices (only the generation may
    be kept): every wanted slice exists with the same content, no other one does, and all
    are at one generation."""
    if set(current) != {str(s["metadata"]["name"]) for s in wanted}:
        return False
    if len({_generation(s) for s in current.values()}) > 1:
        return False
    return all(dra_devices.same_content(current[str(s["metadata"]["name"])], s) for s in wanted)
