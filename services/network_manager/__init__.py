"""network-manager: Secondary networks with netlink and IPAM in KV (node role); Multus
NetworkAttachmentDefinitions (cluster role).

Not built yet: issue 8 builds it. Until then `gpuop run network-manager` starts, connects to the
bus and reports itself not ready, so deployments and the demo show honestly what is missing.
"""

from gpuop.runtime.services import ServiceDefinition
from gpuop.runtime.settings import Role

SERVICE = ServiceDefinition(
    name="network-manager",
    summary="secondary networks, IPAM and NetworkAttachmentDefinitions",
    roles=frozenset({Role.NODE, Role.CLUSTER}),
    pending_issue=8,
)
