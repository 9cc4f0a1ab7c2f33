"""What the device plugin subscribes to: its node's operand commands, its own commands (the
remediation's `ListGpuHolders`), its node's health
history (telemetry's health events and the driver-manager's validations) in one consumer, so
a validation and the XIDs around it are handled in the order they happened, and its node's
config selections (discovery's cluster role, from the Node's label). The consumers are
`gpuop.bus.grants`' table: a node agent's consumer has one filter, which its NATS permissions
bind, so the health consumer takes every event of its node (`gpuop.evt.*.<node>.*`) and the
agent ignores all but the two types.
"""

from __future__ import annotations

from gpuop.bus import ConsumerSpec, grants
from gpuop.events import device, driver, subjects

SERVICE = str(device.OperandService.DEVICE_PLUGIN)


def health_subjects(prefix: str, node: str) -> tuple[str, str]:
    """The node's `device.health-changed` and `driver.validated` events."""
    return (
        subjects.events_filter(
            device.DeviceHealthChanged.DOMAIN, node, device.DeviceHealthChanged.NAME, prefix=prefix
        ),
        subjects.events_filter(
            driver.DriverValidated.DOMAIN, node, driver.DriverValidated.NAME, prefix=prefix
        ),
    )


def _node_consumer(prefix: str, node: str, purpose: str, retry_delay: float) -> ConsumerSpec:
    found = grants.consumer(grants.Identity(SERVICE, node), purpose, prefix=prefix)
    return ConsumerSpec(
        durable=found.durable,
        subjects=found.filters,
        retry_delay=retry_delay,
        deliver_new_only=found.deliver_new_only,
    )


def node_commands(prefix: str, node: str, *, retry_delay: float) -> ConsumerSpec:
    """Pause and resume commands to the operands of `node`. From the start on first
    creation: a pause sent before this node's first plugin ran must still be confirmed;
    later runs resume after the last acked command."""
    return _node_consumer(prefix, node, "commands", retry_delay)


def node_own_commands(prefix: str, node: str, *, retry_delay: float) -> ConsumerSpec:
    """Commands to this node's device plugin itself (`gpuop.cmd.device-plugin.<node>.*`):
    the holder listing. From the start on first creation, as the operands' commands: one
    sent while the plugin restarted is answered when it is back."""
    return _node_consumer(prefix, node, "own-commands", retry_delay)


def node_health(prefix: str, node: str, *, retry_delay: float) -> ConsumerSpec:
    """The health history of `node` (within every event of the node). From the start on
    first creation, so that nothing published while the log was read at start is missed;
    later runs resume after the last acked event, and read what came before from the log.
    Applying an event twice is harmless."""
    return _node_consumer(prefix, node, "health", retry_delay)


def config_subject(prefix: str, node: str) -> str:
    """The node's `device.plugin-config-selected` events."""
    selected = device.DevicePluginConfigSelected
    return subjects.events_filter(selected.DOMAIN, node, selected.NAME, prefix=prefix)


def node_config(prefix: str, node: str, *, retry_delay: float) -> ConsumerSpec:
    """The config selections of `node`. From the start on first creation, like the health
    history; the agent skips what it already read from the log at start."""
    return _node_consumer(prefix, node, "config", retry_delay)
