"""device-plugin: Kubelet device plugin over gRPC: nvidia.com/gpu (time-slicing, MIG, CDI) and
RDMA shared devices, with health from device events.

Not built yet: issue 6 builds it. Until then `gpuop run device-plugin` starts, connects to the
bus and reports itself not ready, so deployments and the demo show honestly what is missing.
"""

from gpuop.runtime.services import ServiceDefinition
from gpuop.runtime.settings import Role

SERVICE = ServiceDefinition(
    name="device-plugin",
    summary="kubelet device plugin for GPUs and RDMA shared devices",
    roles=frozenset({Role.NODE}),
    pending_issue=6,
)
