"""What telemetry subscribes to, in one place.

The node role consumes the operands group's commands for its node (`PauseOperands`,
`ResumeOperands`) with a durable consumer. The cluster role keeps no durable consumer: it
reads the event stream from `operator_metrics` (upgrade history from the start, the rest
from when it started), since its gauges are rebuilt from the log on every start.
"""

from __future__ import annotations

from gpuop.bus import ConsumerSpec, grants
from gpuop.events import device

SERVICE = device.OperandService.TELEMETRY.value


def node_commands(prefix: str, node: str, *, retry_delay: float) -> ConsumerSpec:
    """Commands to every operand on `node` (`gpuop.bus.grants` names it). From the start on
    first creation: a pause sent before this node's first exporter ran must still be
    confirmed; later runs resume after the last acked command."""
    return grants.node_consumer_spec(
        SERVICE, node, "commands", prefix=prefix, retry_delay=retry_delay
    )
