"""What an earlier run of the device plugin on this node left behind, read from the log.

A restarted plugin must not open NVML in the middle of a driver reload, nor advertise a GPU
healthy that threw a critical XID since the last validated driver. Both are facts in the
streams: the node's pause and resume commands (read by `gpuop.operands.from_log`), and its
health events and driver validations (read here). `agent.NodeAgent` reads them at start
and hands them to `plugins.DevicePlugins.restore`; the live consumers take over from there.
The config the node's label selects is the last `device.plugin-config-selected` of the node
(`selection`), so a restarted plugin starts on it rather than on the default. (The claims
allocated on the node are `gpuop.inventory.claims.follow`'s, from the log's start.)
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuop.bus import Bus, StoredMessage
from gpuop.events import MalformedMessage, Payload, UnknownEventType, decode_on, device
from gpuop.events.driver import DriverValidated
from gpuop.services.device_plugin import consumers
from gpuop.services.device_plugin.plugins import HealthRecord


async def health(bus: Bus, node: str) -> list[HealthRecord]:
    """The node's health events and driver validations, in stream order."""
    stored: list[StoredMessage] = []
    for subject in consumers.health_subjects(bus.prefix, node):
        stored.extend([message async for message in bus.read(subject)])
    records: list[HealthRecord] = []
    for message in sorted(stored, key=lambda m: m.seq):
        payload = _payload(message)
        if isinstance(payload, device.DeviceHealthChanged | DriverValidated):
            records.append(payload)
    return records


@dataclass(frozen=True)
class LastSelection:
    """The node's last config selection in the log."""

    requested: str | None = None
    """The label's value; None without a label, or without any selection."""
    seq: int = 0
    """Its stream sequence (0: none): a live delivery at or before it is old news."""


async def selection(bus: Bus, node: str) -> LastSelection:
    """The node's last `device.plugin-config-selected`."""
    last = LastSelection()
    async for message in bus.read(consumers.config_subject(bus.prefix, node)):
        payload = _payload(message)
        if isinstance(payload, device.DevicePluginConfigSelected) and message.seq > last.seq:
            last = LastSelection(payload.config, message.seq)
    return last


def _payload(stored: StoredMessage) -> Payload | None:
    try:
        return decode_on(stored.subject, stored.data)[1]
    except (MalformedMessage, UnknownEventType):
        return None
