"""What network-manager's node role subscribes to: its node's commands (`ApplyNetwork`) and
its node's driver results (an OFED reload recreates the NICs, and the links on them with
them). The cluster role consumes nothing: it reads Kubernetes and writes KV.
"""

from __future__ import annotations

from gpuop.bus import ConsumerSpec, grants
from gpuop.events import network

SERVICE = network.ApplyNetwork.SERVICE


def _node_consumer(prefix: str, node: str, purpose: str, retry_delay: float) -> ConsumerSpec:
    return grants.node_consumer_spec(SERVICE, node, purpose, prefix=prefix, retry_delay=retry_delay)


def node_commands(prefix: str, node: str, *, retry_delay: float) -> ConsumerSpec:
    """Commands to network-manager on `node`."""
    return _node_consumer(prefix, node, "commands", retry_delay)


def node_driver_results(prefix: str, node: str, *, retry_delay: float) -> ConsumerSpec:
    """The driver-manager's results on `node`; new ones only on first creation: the pass at
    start sees what earlier reloads did."""
    return _node_consumer(prefix, node, "driver-events", retry_delay)
