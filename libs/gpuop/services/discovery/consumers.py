"""What discovery subscribes to: the durable consumers of both roles, in one place.

The node role (`node_agent`) consumes its node's commands (`RescanHardware`, and the
operands group's `PauseOperands`/`ResumeOperands`, each with a consumer of its own: a node
agent's consumer has one filter, which its NATS permissions bind) and its node's driver
results, as `gpuop.bus.grants` lists them; the cluster role (`labeler`) consumes every
node's inventories and heartbeats, and the device plugin config each node's plugin runs
(`device.plugin-config-applied`).
"""

from __future__ import annotations

from gpuop.bus import ConsumerSpec, grants
from gpuop.events import device, hardware, subjects

SERVICE = hardware.RescanHardware.SERVICE
LABELER = "discovery-labeler"
LABELER_MAX_DELIVER = 60
"""With the retry interval, how long an inventory waits for its Node to be registered."""


def _node_consumer(prefix: str, node: str, purpose: str, retry_delay: float) -> ConsumerSpec:
    return grants.node_consumer_spec(SERVICE, node, purpose, prefix=prefix, retry_delay=retry_delay)


def node_commands(prefix: str, node: str, *, retry_delay: float) -> ConsumerSpec:
    """Commands to every operand on `node` (the durable `discovery-<node>-commands`, which
    took discovery's own commands too before each got a consumer of its own). From the start
    on first creation: a pause sent before this node's first agent ran must still be
    confirmed; later runs resume after the last acked command."""
    return _node_consumer(prefix, node, "commands", retry_delay)


def node_rescans(prefix: str, node: str, *, retry_delay: float) -> ConsumerSpec:
    """Commands to discovery on `node` (`RescanHardware`). New ones only on first creation:
    the agent scans at start anyway."""
    return _node_consumer(prefix, node, "rescan", retry_delay)


def node_driver_results(prefix: str, node: str, *, retry_delay: float) -> ConsumerSpec:
    """The driver-manager's results on `node`; new ones only on first creation: the scan at
    start sees what earlier results changed."""
    return _node_consumer(prefix, node, "driver-events", retry_delay)


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
