"""discovery: Hardware discovery and node labels: publishes node inventories (node role) and
turns them into GPU Feature Discovery and NFD labels (cluster role).

Not built yet: issue 4 builds it. Until then `gpuop run discovery` starts, connects to the
bus and reports itself not ready, so deployments and the demo show honestly what is missing.
"""

from gpuop.runtime.services import ServiceDefinition
from gpuop.runtime.settings import Role

SERVICE = ServiceDefinition(
    name="discovery",
    summary="hardware inventory and GPU/NFD node labels",
    roles=frozenset({Role.NODE, Role.CLUSTER}),
    pending_issue=4,
)
