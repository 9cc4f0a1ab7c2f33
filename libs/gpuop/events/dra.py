"""Dynamic Resource Allocation: which ResourceClaims hold a node's GPUs, told to the node.

A DRA kubelet plugin is asked to prepare a claim by namespace, name and uid only: the
allocation (which devices, with which configuration) is in the claim's `status.allocation`,
and reading it takes a Kubernetes credential. gpuop's node agents hold none, so the device
plugin's cluster role, which watches ResourceClaims (and writes the node's ResourceSlices
from its inventory), publishes each allocated claim that holds a GPU of a node on that
node's subject: `ClaimAllocated` when a claim is allocated or its consumers change,
`ClaimReleased` when its allocation is gone (deallocated or deleted). The node's DRA plugin
prepares claims from these facts; the remediation's holders, the upgrade's drains and
telemetry's pod labels read the same facts, so a pod given a GPU by any DRA driver (not only
gpuop's) is seen wherever a device-plugin allocation is.

Only the device plugin's cluster role may publish in this domain (bus grants): a node agent
that could publish an allocation could make its own plugin hand out another claim's GPU.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field, StringConstraints

from gpuop.events.envelope import Event
from gpuop.events.fields import DocumentedEnum, GpuUuid, NamespacedName, Record

DRIVER = "gpu.nvidia.com"
"""gpuop's DRA driver name: NVIDIA's, so DeviceClasses and CEL written for it keep working."""

Uid = Annotated[str, StringConstraints(pattern=r"^[0-9a-fA-F-]{1,64}$")]
"""A Kubernetes object uid."""
DriverName = Annotated[
    str,
    StringConstraints(
        max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    ),
]
"""A DRA driver name: a DNS subdomain of at most 63 characters (`gpu.nvidia.com`)."""
PoolName = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=r"^[a-z0-9][-a-z0-9./]*$")
]
"""A resource pool's name: DNS subdomains joined by `/` (gpuop's pool is the node's name)."""
DeviceName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
"""A device's name in its pool, a DNS label: `gpu-0`, `gpu-0-mig-1g18gb-19-0`."""
RequestName = Annotated[
    str,
    StringConstraints(
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(/[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?$"
    ),
]
"""A claim's request name, `<request>` or `<request>/<subrequest>` for `firstAvailable`."""
MigUuid = Annotated[str, StringConstraints(pattern=r"^MIG-[0-9a-fA-F-]{36}$")]
"""A MIG device's UUID as NVML reports it."""


class ClaimRef(NamespacedName):
    """A ResourceClaim, by namespace, name and uid: what the kubelet sends a plugin."""

    uid: Uid
    """The claim's uid; a claim deleted and made again under its name is another claim."""


class PodRef(NamespacedName):
    """A pod that reserves a claim (its `status.reservedFor`)."""

    uid: Uid
    """The pod's uid."""


class AllocatedDevice(Record):
    """One device of a claim's allocation result, and which GPU of the node it is."""

    request: RequestName
    """The claim request the device was allocated for (`gpu`, or `gpu/h200` for a subrequest)."""
    driver: DriverName
    """The DRA driver whose slice holds the device (gpuop's, or another driver's)."""
    pool: PoolName
    """The device's pool."""
    device: DeviceName
    """The device's name in its pool."""
    gpu_uuid: GpuUuid | None = None
    """The node's GPU the device is (or is carved from); None when the publisher could not
    match it to a GPU of the node's inventory (another driver's device without a `uuid` or
    `resource.kubernetes.io/pciBusID` attribute the inventory knows)."""
    mig_uuid: MigUuid | None = None
    """The MIG device, when the device is one."""
    admin_access: bool = False
    """Allocated with `adminAccess` (monitoring access that does not exclude other claims)."""


class ConfigSource(DocumentedEnum):
    """Where an opaque configuration came from (the API's `FromClass` and `FromClaim`)."""

    CLASS = "class"
    """The DeviceClass's `config`."""
    CLAIM = "claim"
    """The claim's `spec.devices.config`; it overrides the class's."""


class OpaqueConfig(Record):
    """One opaque configuration of the allocation for gpuop's driver (the claim's or its
    DeviceClass's `opaque.parameters`, e.g. NVIDIA's `GpuConfig` with a sharing strategy)."""

    source: ConfigSource
    """The class's or the claim's."""
    requests: tuple[RequestName, ...] = Field(default=(), max_length=32)
    """The requests it applies to; empty means every request of the claim."""
    parameters: dict[str, Any]
    """The parameters as the API server holds them, a JSON object (at most 10 KiB there):
    the node's plugin decodes them strictly and refuses what it cannot apply."""


class ClaimAllocated(Event):
    """A ResourceClaim allocated devices that are GPUs of this node (or its reservations
    changed); published by the device plugin's cluster role, again on every change."""

    DOMAIN: ClassVar[str] = "dra"
    NAME: ClassVar[str] = "claim-allocated"

    claim: ClaimRef
    """The claim."""
    devices: tuple[AllocatedDevice, ...] = Field(min_length=1, max_length=32)
    """The allocation's results on this node, in the claim's order."""
    configs: tuple[OpaqueConfig, ...] = Field(default=(), max_length=32)
    """Opaque configurations for gpuop's driver, class ones first (as the API server lists
    them); other drivers' are left out."""
    pods: tuple[PodRef, ...] = Field(default=(), max_length=256)
    """The pods that reserve the claim now; empty between allocation and the first pod's
    reservation."""
    resource_version: Annotated[str, StringConstraints(pattern=r"^[0-9]{1,20}$")]
    """The claim's resourceVersion this was read at: a reader keeps the newest per claim."""


class ClaimReleased(Event):
    """A ResourceClaim that held GPUs of this node no longer does: deallocated or deleted."""

    DOMAIN: ClassVar[str] = "dra"
    NAME: ClassVar[str] = "claim-released"

    claim: ClaimRef
    """The claim."""
    deleted: bool
    """True when the claim is gone, False when it was deallocated and still exists."""
