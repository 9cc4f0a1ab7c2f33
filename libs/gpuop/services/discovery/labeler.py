"""Discovery's cluster role: turns each node's inventory into its Node labels.

`run` (the service's cluster entry point) connects to Kubernetes, then consumes every
node's `hardware.discovered` and `hardware.heartbeat`. For an inventory, `Labeler.apply`
patches the Node with the labels `gpuop.inventory.labeling` derives (GPU Feature
Discovery's `nvidia.com/*` and NFD's `feature.node.kubernetes.io/*`), keeping the
NVML-derived ones it set while the node's driver is unloaded (`labeling.merge`).

Only labels gpuop set are ever removed: the keys it set are listed in the Node annotation
`OWNED_ANNOTATION`, so a label a user or another controller put on the node stays, and a
key gpuop no longer implies goes only if gpuop had set it. The annotation
`HASH_ANNOTATION` names the inventory the labels come from. The patch carries the
resourceVersion it was decided on, and is decided again on a conflict. A Node that does not
exist yet is retried later; every change of labels is recorded as a Kubernetes Event.

A heartbeat whose inventory hash this role has not applied (an inventory missed or dead-
lettered, say while its Node was not registered) makes it apply the node's inventory from
the `gpuop_nodes` KV bucket, where the node agent keeps it.

The sharing labels (`nvidia.com/gpu.replicas`, `gpu.sharing-strategy`, the product's
`-SHARED`) follow the device plugin config in force on each node, which its plugin reports
as `device.plugin-config-applied` (read from the log at start, then consumed with the
inventories): each such report labels the node again from its stored inventory. A node whose
plugin never reported one is labelled with the `replicas` of discovery's own config. `run`
also runs `selections.Selections`, which tells each node's plugin which config its label
`nvidia.com/device-plugin.config` selects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gpuop.bus import Buckets, Bus, Delivery, KeyValue, PermanentError, TemporaryError
from gpuop.events import MalformedMessage, UnknownEventType, decode_on, device, hardware, subjects
from gpuop.inventory import labeling
from gpuop.kube import client, errors, nodes
from gpuop.kube.recording import EventRecorder
from gpuop.runtime import waiting
from gpuop.runtime.services import ServiceContext
from gpuop.services.discovery import consumers
from gpuop.services.discovery.config import DiscoveryConfig
from gpuop.services.discovery.selections import Selections

log = logging.getLogger(__name__)

OWNED_ANNOTATION = "gpuop.io/discovery-labels"
"""Comma-separated keys of the labels gpuop's discovery set on the node."""
HASH_ANNOTATION = "gpuop.io/discovery-inventory-hash"
"""Content hash of the inventory the node's labels were derived from."""
EVENT_REASON = "NodeLabelsChanged"
SUMMARY_LABELS = (
    f"{labeling.GFD}gpu.count",
    f"{labeling.GFD}gpu.product",
    f"{labeling.GFD}cuda.driver-version.full",
    f"{labeling.NFD}kernel-version.full",
)
"""The labels an Event names when they change; the node shows the rest."""

Obj = dict[str, Any]


@dataclass(frozen=True)
class LabelChange:
    """What one labelling pass changed on a node."""

    written: Mapping[str, str] = field(default_factory=dict)
    """Labels added or given a new value."""
    removed: tuple[str, ...] = ()
    """Labels gpuop had set that no longer hold."""

    def __bool__(self) -> bool:
        return bool(self.written or self.removed)

    def describe(self) -> str:
        """Every label set and removed, for the log."""
        parts = []
        if self.written:
            parts.append("set " + ", ".join(f"{k}={v}" for k, v in sorted(self.written.items())))
        if self.removed:
            parts.append("removed " + ", ".join(self.removed))
        return "; ".join(parts) or "no label changed"

    def summary(self) -> str:
        """A short account for the node's Event: the counts, the headline GPU labels set,
        and the labels removed."""
        parts = [f"set {len(self.written)} labels, removed {len(self.removed)}"]
        headline = [f"{k}={self.written[k]}" for k in SUMMARY_LABELS if k in self.written]
        if headline:
            parts.append(", ".join(headline))
        if self.removed:
            parts.append("removed " + ", ".join(self.removed))
        return "; ".join(parts)


def owned_labels(node: Mapping[str, Any]) -> frozenset[str]:
    """The label keys gpuop's discovery set on `node`, from its annotation."""
    listed = nodes.annotations_of(node).get(OWNED_ANNOTATION, "")
    return frozenset(key for key in listed.split(",") if key)


def plan(
    node: Mapping[str, Any],
    inventory: hardware.HardwareDiscovered,
    settings: labeling.LabelSettings,
) -> tuple[Obj | None, LabelChange]:
    """The strategic merge patch that labels `node` for `inventory` (None: nothing to do),
    and the label change it makes."""
    current = nodes.labels_of(node)
    annotations = nodes.annotations_of(node)
    owned = owned_labels(node)
    implied = labeling.labels_for(inventory, settings)
    # only what gpuop set may be carried over: `mig.config` and kin belong to users
    desired = labeling.merge(
        {key: value for key, value in current.items() if key in owned}, implied, inventory
    )
    to_set = {key: value for key, value in desired.items() if current.get(key) != value}
    removed = tuple(sorted(key for key in owned if key not in desired and key in current))
    marks = {OWNED_ANNOTATION: ",".join(sorted(desired)), HASH_ANNOTATION: inventory.inventory_hash}
    to_mark = {key: value for key, value in marks.items() if annotations.get(key) != value}
    change = LabelChange(to_set, removed)
    if not change and not to_mark:
        return None, change
    labels: dict[str, str | None] = {**to_set, **dict.fromkeys(removed)}
    return {"metadata": {"labels": labels, "annotations": to_mark}}, change


class Labeler:
    """Applies inventories to Nodes; one instance per cluster role."""

    def __init__(
        self,
        kube: client.Kube,
        inventories: KeyValue,
        settings: labeling.LabelSettings,
        *,
        recorder: EventRecorder | None = None,
        retry_delay: float = 5.0,
        plugin_configs: Mapping[str, device.DevicePluginConfigApplied] | None = None,
    ) -> None:
        self._kube = kube
        self._inventories = inventories
        self._settings = settings
        self._recorder = recorder
        self._retry_delay = retry_delay
        self._applied: dict[str, str] = {}
        """Node -> hash of the inventory its labels were last made from, by this process."""
        self._plugin_configs: dict[str, device.DevicePluginConfigApplied] = dict(
            plugin_configs or {}
        )
        """Node -> the device plugin config in force there, as its plugin last reported."""
        self._labelled: dict[str, labeling.LabelSettings] = {}
        """Node -> the settings its labels were last made with, by this process."""

    def settings_for(self, node: str) -> labeling.LabelSettings:
        """The label settings of `node`: its plugin's sharing over discovery's own."""
        return labeling.with_plugin_config(self._settings, self._plugin_configs.get(node))

    async def handle(self, delivery: Delivery) -> None:
        """The consumer's handler: inventories, heartbeats and device plugin configs of
        every node."""
        node = delivery.envelope.node
        if isinstance(delivery.payload, hardware.HardwareDiscovered):
            await self.apply(node, delivery.payload)
        elif isinstance(delivery.payload, hardware.HardwareHeartbeat):
            await self.catch_up(node, delivery.payload.inventory_hash)
        elif isinstance(delivery.payload, device.DevicePluginConfigApplied):
            await self.plugin_config(node, delivery.payload)

    async def plugin_config(self, node: str, applied: device.DevicePluginConfigApplied) -> None:
        """The device plugin config now in force on `node`: label it again from its stored
        inventory (or, without one yet, with its first inventory)."""
        self._plugin_configs[node] = applied
        if applied.outcome in (device.ConfigOutcome.UNKNOWN, device.ConfigOutcome.REFUSED):
            log.warning(
                "node %s runs device plugin config %s: %s",
                node,
                applied.config,
                applied.message,
                extra={"node": node},
            )
        if self._labelled.get(node) == self.settings_for(node):
            return  # the same sharing as the node's labels have
        inventory = await self._stored(node)
        if inventory is not None:
            await self.apply(node, inventory)

    async def apply(self, node: str, inventory: hardware.HardwareDiscovered) -> LabelChange:
        """Label `node` for `inventory`; `TemporaryError` while the Node does not exist."""
        change = LabelChange()

        settings = self.settings_for(node)

        def decide(current: Obj) -> Obj | None:
            nonlocal change
            body, change = plan(current, inventory, settings)
            return body

        try:
            await nodes.update_on_fresh_read(self._kube, node, decide)
        except errors.NotFound:
            raise TemporaryError(
                f"node {node} is not registered yet", delay=self._retry_delay
            ) from None
        except errors.KubeError as error:
            if error.temporary:
                delay = error.retry_after or self._retry_delay
                raise TemporaryError(f"labelling node {node}: {error}", delay=delay) from error
            raise PermanentError(f"labelling node {node}: {error}") from error
        self._applied[node] = inventory.inventory_hash
        self._labelled[node] = settings
        if change:
            log.info("labels of node %s: %s", node, change.describe(), extra={"node": node})
            await self._record(node, change)
        return change

    async def catch_up(self, node: str, inventory_hash: str) -> None:
        """Apply the node's stored inventory when a heartbeat names one not applied yet."""
        if self._applied.get(node) == inventory_hash:
            return
        inventory = await self._stored(node)
        if inventory is not None and inventory.inventory_hash == inventory_hash:
            await self.apply(node, inventory)

    async def _stored(self, node: str) -> hardware.HardwareDiscovered | None:
        """The node's inventory in the `gpuop_nodes` bucket; None without a valid one."""
        entry = await self._inventories.get(subjects.encode_node(node))
        if entry is None:
            return None
        try:
            return hardware.HardwareDiscovered.model_validate_json(entry.value)
        except ValidationError as error:
            log.warning("stored inventory of node %s is invalid: %s", node, error)
            return None

    async def _record(self, node: str, change: LabelChange) -> None:
        if self._recorder is None:
            return
        try:
            await self._recorder.node_event(node, EVENT_REASON, change.summary())
        except errors.KubeError as error:
            # an Event is a record of the change, not part of it
            log.warning("could not record the label change of node %s: %s", node, error)


async def run(context: ServiceContext, config: DiscoveryConfig) -> None:
    """The cluster role's entry point: label nodes until the service stops."""
    kube = await _connect(context, config)
    if kube is None:
        return
    retry = config.retry_interval_seconds
    try:
        labeler = Labeler(
            kube,
            await context.bus.kv(Buckets.NODES),
            config.label_settings(),
            recorder=EventRecorder(kube),
            retry_delay=retry,
            plugin_configs=await plugin_configs(context.bus),
        )
        selections = Selections(kube, context.bus, retry_delay=retry)
        await selections.restore()
        subscription = await context.bus.consume(
            consumers.labeler(context.bus.prefix, retry_delay=retry), labeler.handle
        )
        following = asyncio.create_task(selections.run(), name="discovery-config-selections")
        context.ready, context.not_ready_reason = True, ""
        try:
            await context.stopping.wait()
        finally:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
            await subscription.stop()
    finally:
        await kube.close()


async def plugin_configs(bus: Bus) -> dict[str, device.DevicePluginConfigApplied]:
    """Each node's last `device.plugin-config-applied` in the log."""
    found: dict[str, device.DevicePluginConfigApplied] = {}
    async for message in bus.read(consumers.plugin_configs_filter(bus.prefix)):
        try:
            envelope, payload = decode_on(message.subject, message.data)
        except (MalformedMessage, UnknownEventType):
            continue
        if isinstance(payload, device.DevicePluginConfigApplied):
            found[envelope.node] = payload
    return found


async def _connect(context: ServiceContext, config: DiscoveryConfig) -> client.Kube | None:
    """A connection that has answered one request; None when stopped before there was one."""
    while not context.stopping.is_set():
        try:
            kube = await client.connect(context.settings.kubeconfig)
        except errors.KubeError as error:
            reason = str(error)
        else:
            try:
                await kube.call(kube.core.list_node, limit=1)
                return kube
            except errors.KubeError as error:
                reason = str(error)
                await kube.close()
        context.not_ready_reason = f"cannot reach Kubernetes: {reason}"
        log.warning("%s; retrying", context.not_ready_reason)
        await waiting.stopped_within(context.stopping, config.retry_interval_seconds)
    return None
