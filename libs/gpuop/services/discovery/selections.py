"""Discovery's cluster role, second task: the Node labels that select something per node,
told as events to whoever acts on them.

Upstream's config-manager sidecar watches its own Node for the label
`nvidia.com/device-plugin.config`, and its MIG manager for `nvidia.com/mig.config`. gpuop's
node agents hold no Kubernetes credentials, so the cluster role, which reads the Nodes
anyway, does it for all of them with one list+watch: whenever one of `LABELS` is set,
changed or removed on a node, `Selections` publishes its event on that node's subject (the
label's value, None without one):

    nvidia.com/device-plugin.config  device.plugin-config-selected: the node's device plugin
                                     switches to the config it names and answers with
                                     `device.plugin-config-applied`, which the labeler turns
                                     into the node's sharing labels
    nvidia.com/mig.config            device.mig-config-requested: the upgrade orchestrator
                                     starts the node's MIG reconfiguration (`gpuop.saga.mig`)

At start it reads what it published before from the log, so a restarted cluster role
publishes only the labels that changed meanwhile; a node seen for the first time without a
label is not published for it (no label is what its reader assumes). A publish that fails
is tried again with the next change of any Node, and a watch that fails is started again
after `retry_delay`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gpuop.bus import Bus, BusError, StoredMessage
from gpuop.events import (
    Event,
    MalformedMessage,
    UnknownEventType,
    decode_on,
    device,
    mig_requests,
    new_event,
    subjects,
)
from gpuop.kube import client, errors, nodes
from gpuop.kube.watching import ListWatch
from gpuop.services.discovery import consumers

log = logging.getLogger(__name__)

CONFIG_LABEL = device.PLUGIN_CONFIG_LABEL
"""The Node label that selects a node's device plugin config, as upstream's."""
MIG_CONFIG_LABEL = mig_requests.MIG_CONFIG_LABEL
"""The Node label that names a node's MIG config, as upstream's."""
SOURCE = f"/gpuop/{consumers.LABELER}"


@dataclass(frozen=True)
class SelectingLabel:
    """A Node label told as an event whenever it changes."""

    key: str
    event: type[Event]
    """The event type; its one field `config` carries the label's value."""
    what: str
    """What the label selects, for the log."""

    def payload(self, value: str | None) -> Event:
        return self.event.model_validate({"config": value})

    def value_of(self, payload: Event) -> str | None:
        value = getattr(payload, "config", None)
        return None if value is None else str(value)

    def filter(self, prefix: str) -> str:
        """Every node's event of this label."""
        return subjects.events_filter(self.event.DOMAIN, name=self.event.NAME, prefix=prefix)


PLUGIN_CONFIG = SelectingLabel(
    CONFIG_LABEL, device.DevicePluginConfigSelected, "device plugin config"
)
MIG_CONFIG = SelectingLabel(MIG_CONFIG_LABEL, mig_requests.MigConfigRequested, "MIG config")
LABELS: tuple[SelectingLabel, ...] = (PLUGIN_CONFIG, MIG_CONFIG)
"""Every label `Selections` follows."""


def requested_config(node: Mapping[str, Any], key: str = CONFIG_LABEL) -> str | None:
    """The value of `node`'s label `key`; None without the label (or with an empty one)."""
    return nodes.labels_of(node).get(key) or None


def selections_filter(prefix: str) -> str:
    """Every node's `device.plugin-config-selected`."""
    return PLUGIN_CONFIG.filter(prefix)


class Selections:
    """Publishes each node's selecting labels when they change."""

    def __init__(
        self,
        kube: client.Kube,
        bus: Bus,
        *,
        retry_delay: float = 5.0,
        labels: tuple[SelectingLabel, ...] = LABELS,
    ) -> None:
        self._kube = kube
        self._bus = bus
        self._retry_delay = retry_delay
        self._labels = labels
        self._published: dict[tuple[str, str], str | None] = {}
        """(Label key, node) -> the label value last published for it."""
        self._unsent: dict[tuple[str, str], str | None] = {}
        """(Label key, node) -> a label value whose publish failed."""

    @property
    def published(self) -> Mapping[str, str | None]:
        """Node -> the device plugin config last published for it."""
        return self.published_for(CONFIG_LABEL)

    def published_for(self, key: str) -> Mapping[str, str | None]:
        """Node -> the value of label `key` last published for it."""
        return {node: value for (label, node), value in self._published.items() if label == key}

    async def restore(self) -> None:
        """Learn from the log what was published for each node. Raises `BusError`."""
        for label in self._labels:
            async for message in self._bus.read(label.filter(self._bus.prefix)):
                found = _selection(message, label)
                if found is not None:
                    self._published[(label.key, found[0])] = found[1]

    async def observe(self, name: str, node: Mapping[str, Any]) -> bool:
        """Take in one state of a Node; whether any label's event was published. Raises
        `BusError` (and keeps the value to try again) when the bus does not take one."""
        sent = False
        for label in self._labels:
            key = (label.key, name)
            value = requested_config(node, label.key)
            if self._published.get(key) == value:
                self._unsent.pop(key, None)
                continue
            self._unsent[key] = value
            await self._publish(key, value)
            sent = True
        return sent

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
                    continue  # a node registered again under its name says its labels anew
                name = str(change.object["metadata"]["name"])
                try:
                    await self._retry_unsent(except_for=name)
                    await self.observe(name, change.object)
                except BusError as error:
                    log.warning("cannot publish the selecting labels of %s yet: %s", name, error)

    async def _retry_unsent(self, *, except_for: str) -> None:
        for key, value in list(self._unsent.items()):
            if key[1] != except_for:
                await self._publish(key, value)

    async def _publish(self, key: tuple[str, str], value: str | None) -> None:
        label = next(label for label in self._labels if label.key == key[0])
        name = key[1]
        try:
            envelope = new_event(label.payload(value), node=name, source=SOURCE)
        except (ValidationError, ValueError) as error:  # not from a real API server
            log.warning("ignoring the label %s of node %s: %s", label.key, name, error)
            self._unsent.pop(key, None)
            return
        await self._bus.publish(envelope)
        self._published[key] = value
        self._unsent.pop(key, None)
        log.info("node %s selects %s %s", name, label.what, value or "(none: the default)")


def _selection(message: StoredMessage, label: SelectingLabel) -> tuple[str, str | None] | None:
    try:
        envelope, payload = decode_on(message.subject, message.data)
    except (MalformedMessage, UnknownEventType):
        return None
    if not isinstance(payload, label.event):
        return None
    return envelope.node, label.value_of(payload)
