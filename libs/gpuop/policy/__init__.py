"""The `GPUClusterPolicy`: desired driver versions, the upgrade policy, status and CRD.

Who uses it: the upgrade orchestrator reads each policy it watches with `validate_spec` and
writes `PolicyStatus` back; its decision core decides with an `UpgradePolicy`; network-manager
reads the `network` section (`NetworkSpec`); the CLI and the Helm chart install the CRD that
`gpuop.policy.crd` generates.

Modules, in the order a policy flows through them:

    fields       the base of every spec section: camelCase wire names, strict, frozen
    selectors    label selector strings (`podSelector`), checked up front
    drivers      `driver`: `DriverSpec` and `ComponentSpec` (version, source)
    flavours     `driver.gpu.kernelModuleType` resolved for one node (`auto`: its GPUs)
    parameters   `driver.gpu.kernelModuleParameters`, checked against what modules declare
    deadlines    `upgradePolicy.deadlines` and `upgradePolicy.retry`
    ladders      `upgradePolicy.validation`: the rungs checked before the uncordon
    upgrades     `upgradePolicy`: `UpgradePolicy` and its upstream sections, plus canary
    pools        `network.networks[].ipam`: `IpamPool`, the addresses a network gives nodes
    rdma         `network.rdmaSharedDevices` and the NIC selectors networks share
    networks     `network`: `NetworkSpec`, `SecondaryNetwork`, and `PublishedNetwork`, the
                 section as node agents read it from the `gpuop_config` KV bucket
    deviceapis   `deviceAPI` (top level and per pool): the kubelet API serving a node's GPUs
    specs        `GPUClusterPolicySpec` and the resource's group, version and names
    validation   `validate_spec`, `PolicyInvalid` with the path of each wrong field
    conditions   `PolicyStatus`, `Condition`, `condition` and `set_condition`
    openapi      pydantic JSON Schema to structural OpenAPI for the CRD
    crd          the CustomResourceDefinition; `python -m gpuop.policy.crd OUTFILE`
"""

from gpuop.policy.conditions import (
    Condition,
    ConditionType,
    PolicyStatus,
    condition,
    set_condition,
)
from gpuop.policy.deadlines import Deadlines, Retry
from gpuop.policy.drivers import ComponentSpec, DriverSpec
from gpuop.policy.ladders import Preflight, Validation, ValidationPod
from gpuop.policy.networks import Master, NetworkSpec, PublishedNetwork, SecondaryNetwork
from gpuop.policy.pools import IpamPool
from gpuop.policy.rdma import NicSelectors, RdmaSelectors, RdmaSharedDevice
from gpuop.policy.specs import GPUClusterPolicySpec
from gpuop.policy.upgrades import (
    Budget,
    Canary,
    Drain,
    PodDeletion,
    UpgradePolicy,
    WaitForCompletion,
    unavailable_budget,
)
from gpuop.policy.validation import FieldProblem, PolicyInvalid, valid_condition, validate_spec

__all__ = [
    "Budget",
    "Canary",
    "ComponentSpec",
    "Condition",
    "ConditionType",
    "Deadlines",
    "Drain",
    "DriverSpec",
    "FieldProblem",
    "GPUClusterPolicySpec",
    "IpamPool",
    "Master",
    "NetworkSpec",
    "NicSelectors",
    "PodDeletion",
    "PolicyInvalid",
    "PolicyStatus",
    "Preflight",
    "PublishedNetwork",
    "RdmaSelectors",
    "RdmaSharedDevice",
    "Retry",
    "SecondaryNetwork",
    "UpgradePolicy",
    "Validation",
    "ValidationPod",
    "WaitForCompletion",
    "condition",
    "set_condition",
    "unavailable_budget",
    "valid_condition",
    "validate_spec",
]
