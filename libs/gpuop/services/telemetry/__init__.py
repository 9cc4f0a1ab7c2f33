"""telemetry: GPU metrics with dcgm-exporter's names (node role), XID/ECC health events, and
operator metrics from the event stream (cluster role).

The node role (`node_exporter`) collects NVML readings on its own loops (`collecting`,
`sessions`) and serves them, rendered once per collection (`exposition`, `catalog`), on the
service's `/metrics`; pod labels come from the kubelet's PodResources API (`pods`,
`kubelet_pods`); XID and ECC events become `device.health-changed` (`health`); pause and
resume commands close and reopen NVML (`gpuop.operands`). The cluster role
(`cluster_exporter`) turns the upgrade, driver, device and dead-letter streams into
operator metrics (`operator_metrics`). Both read `--config` (`config`); `consumers` names
what the node role subscribes to.
"""

from gpuop.runtime.services import ServiceDefinition, by_role
from gpuop.runtime.settings import Role
from gpuop.services.telemetry import config

SERVICE = ServiceDefinition(
    name="telemetry",
    summary="GPU metrics, health events and operator metrics",
    roles=frozenset({Role.NODE, Role.CLUSTER}),
    main=by_role(config.load_config, f"{__name__}.node_exporter", f"{__name__}.cluster_exporter"),
)
