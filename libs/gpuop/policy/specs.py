"""The `GPUClusterPolicy` custom resource: its identity and the model of its spec.

One cluster-scoped `GPUClusterPolicy` (group `gpuop.io`) holds the desired driver versions
and the upgrade policy. The upgrade orchestrator watches it through `gpuop.kube.customobjects`
and reads each spec with `gpuop.policy.validation.validate_spec`; `gpuop.policy.crd` builds
the CustomResourceDefinition from these models. Network-manager reads the `network` section.
"""

from __future__ import annotations

from typing import Any

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

    def to_wire(self) -> dict[str, Any]:
        """The spec as it is written to the API server: camelCase, unset optionals left out."""
        wire = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        if not wire["driver"]["pools"]:
            del wire["driver"]["pools"]  # as an operator writes a policy without pools
        return wire
