"""driver-manager: Executes driver commands on its node: unload, install, load, validate,
rollback, reboot; idempotent by command id.

Not built yet: issue 4 builds it. Until then `gpuop run driver-manager` starts, connects to the
bus and reports itself not ready, so deployments and the demo show honestly what is missing.
"""

from gpuop.runtime.services import ServiceDefinition
from gpuop.runtime.settings import Role

SERVICE = ServiceDefinition(
    name="driver-manager",
    summary="runs driver unload/install/load/validate/rollback/reboot commands",
    roles=frozenset({Role.NODE}),
    pending_issue=4,
)
