"""discovery: hardware inventory and node labels.

The node role (`node_agent`) reads the node's PCI functions, NVML inventory, kernel, OS and
boot id from the host root, publishes `hardware.discovered` when anything changed and a
`hardware.heartbeat` on a period, rescans on command and after driver changes, and lets go
of NVML while operands are paused. The cluster role (`labeler`) turns every inventory into
GPU Feature Discovery and NFD node labels, and removes the ones it set that no longer hold;
it also watches the Nodes' `nvidia.com/device-plugin.config` label and tells each node's
device plugin which config it selects (`selections`).
Both read their intervals and label settings from `--config` (`config`); `consumers` names
what each role subscribes to, `gpuop.operands` decides when the node role may touch NVML.
"""

from gpuop.runtime.services import ServiceContext, ServiceDefinition
from gpuop.runtime.settings import Role
from gpuop.services.discovery import config


async def main(context: ServiceContext) -> None:
    """Run the role `--role` names until the service stops; only that role's modules are
    imported (a node agent carries no Kubernetes client)."""
    settings = config.load_config(context.settings.config)
    if context.settings.role is Role.NODE:
        from gpuop.services.discovery import node_agent

        await node_agent.run(context, settings)
    else:
        from gpuop.services.discovery import labeler

        await labeler.run(context, settings)


SERVICE = ServiceDefinition(
    name="discovery",
    summary="hardware inventory and GPU/NFD node labels",
    roles=frozenset({Role.NODE, Role.CLUSTER}),
    main=main,
)
