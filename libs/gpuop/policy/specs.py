"""The `GPUClusterPolicy` custom resource: its identity and the model of its spec.

One cluster-scoped `GPUClusterPolicy` (group `gpuop.io`) holds the desired driver versions
and the upgrade policy. The upgrade orchestrator watches it through `gpuop.kube.customobjects`
and reads each spec with `gpuop.policy.validation.validate_spec`; `gpuop.policy.crd` builds
the CustomResourceDefinition from these models. Network-manager reads the `network` section.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, model_validator

from gpuop.events.device_api_commands import DeviceApi
from gpuop.policy import deviceapis, ladders
from gpuop.policy.deviceapis import DeviceApiSetting
from gpuop.policy.drivers import DriverSpec
from gpuop.policy.fields import Section
from gpuop.policy.mig import MigPolicy
from gpuop.policy.networks import NetworkSpec
from gpuop.policy.remediation import RemediationPolicy
from gpuop.policy.upgrades import UpgradePolicy

GROUP = "gpuop.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GPUClusterPolicy"
PLURAL = "gpuclusterpolicies"
SINGULAR = "gpuclusterpolicy"
CRD_NAME = f"{PLURAL}.{GROUP}"


class GPUClusterPolicySpec(Section):
    """The desired state of gpuop's nodes: driver versions, how to roll them out, and their
    secondary networks."""

    driver: DriverSpec
    """The driver versions every managed node should run."""
    upgrade_policy: UpgradePolicy = UpgradePolicy()
    """How a change of the driver versions is rolled across the nodes."""
    network: NetworkSpec = NetworkSpec()
    """Secondary networks, RDMA sharing, and what gpuop may do to the management NIC."""
    remediation: RemediationPolicy = RemediationPolicy()
    """What gpuop does when a GPU turns unhealthy: quarantine, reset, reboot, the breaker."""
    mig: MigPolicy = MigPolicy()
    """The MIG layouts the node label `nvidia.com/mig.config` may name, and how a node is
    re-carved."""
    device_api: DeviceApiSetting = Field(default=None, alias=deviceapis.FIELD)
    """Which kubelet API serves the GPUs of every node no driver pool chooses for:
    `devicePlugin` (`nvidia.com/gpu`, the default when unset) or `dra` (Dynamic Resource
    Allocation: ResourceSlices of the driver `gpu.nvidia.com`). A change switches each node
    with a `device-api` saga: cordon, drain its GPU pods, switch, validate, uncordon."""

    @model_validator(mode="after")
    def _remediation_preflight_named(self) -> GPUClusterPolicySpec:
        if "preflight" in self.remediation.rungs:
            ladders.require_preflight(self.upgrade_policy.validation, "remediation", "rungs ")
        return self

    def device_api_for(self, labels: Mapping[str, str]) -> DeviceApi:
        """The API the node with `labels` should serve: its driver pool's `deviceAPI`, else
        the top-level one, else the device plugin."""
        pool = self.driver.pool_for(labels)
        chosen = pool.device_api if pool is not None and pool.device_api else self.device_api
        return deviceapis.api_of(chosen)

    def to_wire(self) -> dict[str, Any]:
        """The spec as it is written to the API server: camelCase, unset optionals left out."""
        wire = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        if not wire["driver"]["pools"]:
            del wire["driver"]["pools"]  # as an operator writes a policy without pools
        return wire
