"""upgrade-orchestrator: Rolling driver upgrades as durable per-node sagas, leader-elected with
a Lease.

Not built yet: issue 5 builds it. Until then `gpuop run upgrade-orchestrator` starts,
connects to the bus and reports itself not ready, so deployments and the demo show
honestly what is missing.
"""

from gpuop.runtime.services import ServiceDefinition
from gpuop.runtime.settings import Role

SERVICE = ServiceDefinition(
    name="upgrade-orchestrator",
    summary="rolling driver upgrades as durable per-node sagas",
    roles=frozenset({Role.CLUSTER}),
    pending_issue=5,
)
