"""Discovery's cluster role, second task: which device plugin config each node's label
selects, told to that node's device plugin.

Upstream's config-manager sidecar watches its own Node for the label
`nvidia.com/device-plugin.config`. gpuop's node agents hold no Kubernetes credentials, so the
cluster role, which reads the Nodes anyway, does it for all of them with one list+watch:
whenever a node's label is set, changed or removed, `Selections` publishes
`device.plugin-config-selected` on that node's subject (`config`: the label's value, None
without one). The node's device plugin switches to the config it names and answers with
`device.plugin-config-applied`, which the labeler turns into the node's sharing labels.

At start it reads what it published before from the log, so a restarted cluster role
publishes only the labels that changed meanwhile; a node seen for the first time without the
label is not published (no label is what the plugin assumes). A publish that fails is tried
again with the next change of any Node, and a watch that fails is started again after
`retry_delay`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from gpuop.bus import Bus, BusError, StoredMessage
from gpuop.events import MalformedMessage, UnknownEventType, decode, device, new_event, subjects
from gpuop.kube import client, errors, nodes
from gpuop.kube.watching import ListWatch
from gpuop.services.discovery import consumers

log = logging.getLogger(__name__)

CONFIG_LABEL = device.PLUGIN_CONFIG_LABEL
"""The Node label that selects a node's device plugin config, as upstream's."""
SOURCE = f"/gpuop/{consumers.LABELER}"


def requested_config(node: Mapping[str, Any]) -> str | None:
    """The config `node`'s label names; None without the label (or with an empty one)."""
    return nodes.labels_of(node).get(CONFIG_LABEL) or None


def selections_filter(prefix: str) -> str:
    """Every node's `device.plugin-config-selected`."""
    selected = device.DevicePluginConfigSelected
    return subjects.events_filter(selected.DOMAIN, name=selected.NAME, prefix=prefix)


class Selections:
    """Publishes each node's config label when it changes."""

    def __init__(self, kube: client.Kube, bus: Bus, *, retry_delay: float = 5.0) -> None:
        self._kube = kube
        self._bus = bus
        self._retry_delay = retry_delay
        self._published: dict[str, str | None] = {}
        """Node -> the label value last published for it."""
        self._unsent: dict[str, str | None] = {}
        """Node -> a label value whose publish failed."""

    @property
    def published(self) -> Mapping[str, str | None]:
        return dict(self._published)

    async def restore(self) -> None:
        """Learn from the log what was published for each node. Raises `BusError`."""
        async for message in self._bus.read(selections_filter(self._bus.prefix)):
            found = _selection(message)
            if found is not None:
                self._published[found[0]] = found[1].config

    async def observe(self, name: str, node: Mapping[str, Any]) -> bool:
        """Take in one state of a Node; whether a selection was published. Raises
        `BusError` (and keeps the value to try again) when the bus does not take it."""
        value = requested_config(node)
        if self._published.get(name) == value:
            self._unsent.pop(name, None)
            return False
        self._unsent[name] = value
        await self._publish(name, value)
        return True

    async def run(self) -> None:
        """Follow the Nodes until cancelled."""
        while True:
            try:
                await self._follow()
            except errors.KubeError as error:
                log.warning("cannot watch the Nodes, again in %.0f s: %s", self._retry_delay, error)
            except Exception:  # the labelling goes on: never leave the Nodes unwatched
                log.exception("the watch of the Nodes failed, again in %.0f s", self._retry_delay)
            await asyncio.sleep(self._retry_delay)

    async def _follow(self) -> None:
        async with ListWatch(self._kube, self._kube.core.list_node) as watch:
            async for change in watch:
                if change.type == "DELETED":
                    continue  # a node registered again under its name says its label anew
                name = str(change.object["metadata"]["name"])
                try:
                    await self._retry_unsent(except_for=name)
                    await self.observe(name, change.object)
                except BusError as error:
                    log.warning("cannot publish the config label of %s yet: %s", name, error)

    async def _retry_unsent(self, *, except_for: str) -> None:
        for name, value in list(self._unsent.items()):
            if name != except_for:
                await self._publish(name, value)

    async def _publish(self, name: str, value: str | None) -> None:
        try:
            payload = device.DevicePluginConfigSelected(config=value)
            envelope = new_event(payload, node=name, source=SOURCE)
        except (ValidationError, ValueError) as error:  # not from a real API server
            log.warning("ignoring the config label of node %s: %s", name, error)
            self._unsent.pop(name, None)
            return
        await self._bus.publish(envelope)
        self._published[name] = value
        self._unsent.pop(name, None)
        log.info("node %s selects device plugin config %s", name, value or "(the default)")


def _selection(message: StoredMessage) -> tuple[str, device.DevicePluginConfigSelected] | None:
    try:
        envelope, payload = decode(message.data)
    except (MalformedMessage, UnknownEventType):
        return None
    if not isinstance(payload, device.DevicePluginConfigSelected):
        return None
    return envelope.node, payload
