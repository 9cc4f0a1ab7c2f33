"""telemetry: GPU metrics with dcgm-exporter names (node role), XID/ECC health events, and
operator metrics from the event stream (cluster role).

Not built yet: issue 7 builds it. Until then `gpuop run telemetry` starts, connects to the
bus and reports itself not ready, so deployments and the demo show honestly what is missing.
"""

from gpuop.runtime.services import ServiceDefinition
from gpuop.runtime.settings import Role

SERVICE = ServiceDefinition(
    name="telemetry",
    summary="GPU metrics, health events and operator metrics",
    roles=frozenset({Role.NODE, Role.CLUSTER}),
    pending_issue=7,
)
