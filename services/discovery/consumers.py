"""What discovery subscribes to: the durable consumers of both roles, in one place.

The node role (`node_agent`) consumes its node's commands (`RescanHardware`, and the
operands group's `PauseOperands`/`ResumeOperands`) and its node's driver results; the
cluster role (`labeler`) consumes every node's inventories and heartbeats, and the device
plugin config each node's plugin runs (`device.plugin-config-applied`).
"""

from __future__ import annotations

from gpuop.bus import ConsumerSpec, streams
from gpuop.events import device, driver, hardware, subjects

SERVICE = hardware.RescanHardware.SERVICE
LABELER = "discovery-labeler"
LABELER_MAX_DELIVER = 60
"""With the retry interval, how long an inventory waits for its Node to be registered."""


def node_commands(prefix: str, node: str, *, retry_delay: float) -> ConsumerSpec:
    """Commands to discovery on `node`, and to every operand there."""
    return ConsumerSpec(
        durable=streams.node_durable(SERVICE, node, "commands"),
        subjects=(
            subjects.commands_filter(SERVICE, node, prefix=prefix),
            subjects.commands_filter(device.OPERANDS, node, prefix=prefix),
        ),
        retry_delay=retry_delay,
        # from the start on first creation: a pause sent before this node's first agent
        # ran must still be confirmed; later runs resume after the last acked command
    )


def node_driver_results(prefix: str, node: str, *, retry_delay: float) -> ConsumerSpec:
    """The driver-manager's results on `node`."""
    return ConsumerSpec(
        durable=streams.node_durable(SERVICE, node, "driver-events"),
        subjects=(subjects.events_filter(driver.DriverResult.DOMAIN, node, prefix=prefix),),
        retry_delay=retry_delay,
        deliver_new_only=True,  # the scan at start sees what earlier results changed
    )


def plugin_configs_filter(prefix: str) -> str:
    """Every node's `device.plugin-config-applied`."""
    applied = device.DevicePluginConfigApplied
    return subjects.events_filter(applied.DOMAIN, name=applied.NAME, prefix=prefix)


def labeler(prefix: str, *, retry_delay: float) -> ConsumerSpec:
    """Every node's inventories, heartbeats and device plugin configs in force, one node at
    a time."""
    domain = hardware.HardwareDiscovered.DOMAIN
    return ConsumerSpec(
        durable=LABELER,
        subjects=(
            subjects.events_filter(domain, name=hardware.HardwareDiscovered.NAME, prefix=prefix),
            subjects.events_filter(domain, name=hardware.HardwareHeartbeat.NAME, prefix=prefix),
            plugin_configs_filter(prefix),
        ),
        max_deliver=LABELER_MAX_DELIVER,
        retry_delay=retry_delay,
    )
