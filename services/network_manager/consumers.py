"""What network-manager's node role subscribes to: its node's commands (`ApplyNetwork`) and
its node's driver results (an OFED reload recreates the NICs, and the links on them with
them). The cluster role consumes nothing: it reads Kubernetes and writes KV.
"""

from __future__ import annotations

from gpuop.bus import ConsumerSpec, streams
from gpuop.events import driver, network, subjects

SERVICE = network.ApplyNetwork.SERVICE


def node_commands(prefix: str, node: str, *, retry_delay: float) -> ConsumerSpec:
    """Commands to network-manager on `node`."""
    return ConsumerSpec(
        durable=streams.node_durable(SERVICE, node, "commands"),
        subjects=(subjects.commands_filter(SERVICE, node, prefix=prefix),),
        retry_delay=retry_delay,
    )


def node_driver_results(prefix: str, node: str, *, retry_delay: float) -> ConsumerSpec:
    """The driver-manager's results on `node`."""
    return ConsumerSpec(
        durable=streams.node_durable(SERVICE, node, "driver-events"),
        subjects=(subjects.events_filter(driver.DriverResult.DOMAIN, node, prefix=prefix),),
        retry_delay=retry_delay,
        deliver_new_only=True,  # the pass at start sees what earlier reloads did
    )
