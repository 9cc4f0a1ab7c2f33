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

from gpuop.runtime.services import ServiceDefinition, by_role
from gpuop.runtime.settings import Role
from gpuop.services.discovery import config

SERVICE = ServiceDefinition(
    name="discovery",
    summary="hardware inventory and GPU/NFD node labels",
    roles=frozenset({Role.NODE, Role.CLUSTER}),
    main=by_role(config.load_config, f"{__name__}.node_agent", f"{__name__}.labeler"),
)
