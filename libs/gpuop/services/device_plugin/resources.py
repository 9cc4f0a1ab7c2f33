"""Which extended resources the plugin advertises, and the device ids of each.

`gpu_resources` turns a `GpuInventory` into `GpuResource`s by the configured MIG strategy
and time-slicing; `rdma.RdmaResource` is the other kind. Both satisfy `Resource`, which is
all a `serving.PluginServer` needs: the devices to list, and the answers to Allocate and
GetPreferredAllocation.

    none    every GPU as nvidia.com/gpu (MIG mode ignored)
    single  every MIG device as nvidia.com/gpu; every GPU must be MIG-enabled, carved, and
            in one profile, or nvidia.com/gpu advertises nothing and `problem` says why
    mixed   MIG devices as nvidia.com/mig-<profile> (`+` becomes `.`; devices whose compute
            instance is part of a GPU instance are left out), other GPUs as nvidia.com/gpu

Time-slicing, or MPS, then gives each device of a replicated resource `replicas` ids
`<uuid>::<n>`, and `renameByDefault` advertises such a resource as `<name>.shared`. An
MPS-shared resource also names its control daemon (`mps.MpsDaemon`): Allocate hands its
pipe and limits out, `plugins` has `mpscontrol` run it, and its devices are Unhealthy while
it does not run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpuop.events.driver import Component
from gpuop.kubelet.deviceplugin.v1beta1 import api_pb2
from gpuop.services.device_plugin import allocating, preferring
from gpuop.services.device_plugin.config import (
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    DevicePluginConfig,
    MigStrategy,
)
from gpuop.services.device_plugin.errors import AllocationError
from gpuop.services.device_plugin.inventory import GpuInventory, Target
from gpuop.services.device_plugin.mps import MpsDaemon, daemon_for

REPLICA_SEPARATOR = "::"
"""Between a device's UUID and its replica number: `GPU-...::3`."""
SHARED_SUFFIX = ".shared"
"""Appended to a replicated resource's name under `renameByDefault`."""
MAX_SHARED_REQUEST = "maximum request size for shared resources is 1"
"""Upstream's words when `failRequestsGreaterThanOne` refuses a request."""


@dataclass(frozen=True)
class AdvertisedDevice:
    """One device id as the kubelet sees it."""

    id: str
    """The id in ListAndWatch and Allocate."""
    numa_node: int | None
    """Its NUMA node, for the kubelet's topology manager."""
    gpu_uuid: str | None
    """The physical GPU whose health it shares; None for an RDMA shared device."""


class Resource(Protocol):
    """What a plugin server serves for one extended resource."""

    @property
    def name(self) -> str:
        """`nvidia.com/gpu`, `rdma/roce_shared`."""

    @property
    def component(self) -> Component:
        """The driver stack it depends on; paused with it."""

    @property
    def devices(self) -> tuple[AdvertisedDevice, ...]:
        """Its device ids, in a stable order."""

    @property
    def preferred_allocation_available(self) -> bool:
        """Whether GetPreferredAllocation has anything to say."""

    def allocate(self, device_ids: Sequence[str]) -> api_pb2.ContainerAllocateResponse:
        """One container's answer; raises `AllocationError`. It must follow from the
        resource alone, with no I/O: the plugin server keeps it for as long as it serves
        this resource object."""

    def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """`size` ids of `available`, `must_include` among them; raises `AllocationError`."""


@dataclass(frozen=True)
class GpuDevice(AdvertisedDevice):
    """A GPU, MIG device or replica of one."""

    target: Target
    """What the id gives a container."""
    replica: int | None = None
    """The replica number of a time-sliced id."""


@dataclass(frozen=True)
class GpuResource:
    """`nvidia.com/gpu`, `nvidia.com/gpu.shared` or a mixed-strategy MIG resource."""

    name: str
    devices: tuple[GpuDevice, ...]
    inventory: GpuInventory
    answers: allocating.GpuAnswers
    replicas: int = 1
    fail_requests_greater_than_one: bool = False
    mps: MpsDaemon | None = None
    """The MPS control daemon whose clients its replicas are; None unless shared with MPS."""
    component: Component = Component.GPU
    preferred_allocation_available: bool = True
    _by_id: dict[str, GpuDevice] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {device.id: device for device in self.devices})

    def allocate(self, device_ids: Sequence[str]) -> api_pb2.ContainerAllocateResponse:
        devices = self._lookup(device_ids)
        if self.replicas > 1 and self.fail_requests_greater_than_one and len(devices) > 1:
            raise AllocationError(
                f"{self.name}: {MAX_SHARED_REQUEST} (asked for {len(devices)}:"
                f" {', '.join(device_ids)})"
            )
        targets = list(dict.fromkeys(device.target for device in devices))
        return self.answers.container_response(targets, self.mps)

    def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        candidates = self._lookup(available)
        required = self._lookup(must_include)
        chosen = preferring.prefer(candidates, required, size, self.inventory.score)
        return [device.id for device in chosen]

    def _lookup(self, device_ids: Sequence[str]) -> list[GpuDevice]:
        unknown = [device_id for device_id in device_ids if device_id not in self._by_id]
        if unknown:
            raise AllocationError(f"{self.name}: unknown device id {', '.join(map(repr, unknown))}")
        return [self._by_id[device_id] for device_id in device_ids]


@dataclass(frozen=True)
class VacantResource:
    """A resource the node no longer has (its MIG profile is gone): served with no device
    until the plugin stops, so the kubelet drops its capacity at once rather than after the
    grace period of a plugin that went away."""

    name: str
    component: Component
    devices: tuple[AdvertisedDevice, ...] = ()
    preferred_allocation_available: bool = False

    def allocate(self, device_ids: Sequence[str]) -> api_pb2.ContainerAllocateResponse:
        raise AllocationError(
            f"{self.name}: unknown device id {', '.join(map(repr, device_ids))}:"
            " the node no longer has this resource"
        )

    def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        raise AllocationError(f"{self.name}: the node no longer has this resource")


@dataclass(frozen=True)
class GpuPlan:
    """The GPU resources to advertise, and what is wrong with the MIG layout, if anything."""

    resources: tuple[GpuResource, ...]
    problem: str | None = None


def gpu_resources(inventory: GpuInventory, config: DevicePluginConfig) -> GpuPlan:
    """The GPU resources the inventory gives under `config`."""
    groups, problem = _by_strategy(inventory, config.flags.mig_strategy)
    flags = config.flags.plugin.resolved(cdi_ready=bool(inventory.cdi_names))
    answers = allocating.GpuAnswers(flags, inventory.control_nodes, inventory.cdi_names)
    sharing = config.sharing
    resources = []
    for name, targets in groups.items():
        replicas = sharing.replicas(name)
        shared = replicas > 1
        advertised = f"{name}{SHARED_SUFFIX}" if shared and sharing.rename_by_default else name
        daemon = None
        if shared and sharing.uses_mps and targets:
            daemon = daemon_for(advertised, targets, replicas, config.flags.mps_root)
        resources.append(
            GpuResource(
                name=advertised,
                devices=tuple(_devices(targets, replicas)),
                inventory=inventory,
                answers=answers,
                replicas=replicas,
                fail_requests_greater_than_one=shared and sharing.fail_requests_greater_than_one,
                mps=daemon,
            )
        )
    return GpuPlan(tuple(resources), problem)


def mps_daemons(plan: GpuPlan) -> tuple[MpsDaemon, ...]:
    """The MPS control daemons `plan` needs, one per MPS-shared resource."""
    return tuple(resource.mps for resource in plan.resources if resource.mps is not None)


def mig_resource(profile: str) -> str:
    """The mixed strategy's resource for a MIG profile: `1g.18gb+me` is
    `nvidia.com/mig-1g.18gb.me`."""
    return MIG_RESOURCE_PREFIX + profile.replace("+", ".")


def _by_strategy(
    inventory: GpuInventory, strategy: MigStrategy
) -> tuple[dict[str, list[Target]], str | None]:
    gpus = inventory.gpus
    if strategy is MigStrategy.NONE:
        return {GPU_RESOURCE: [gpu.whole for gpu in gpus]}, None
    if strategy is MigStrategy.SINGLE:
        problem = _single_strategy_problem(inventory)
        if problem is not None:
            return {GPU_RESOURCE: []}, problem
        return {GPU_RESOURCE: [mig for gpu in gpus for mig in gpu.mig_devices]}, None
    groups: dict[str, list[Target]] = {}
    whole = [gpu.whole for gpu in gpus if not gpu.mig_enabled]
    if whole:
        groups[GPU_RESOURCE] = whole
    for gpu in gpus:
        for mig in gpu.mig_devices:
            if mig.profile is not None and mig.full_compute:
                groups.setdefault(mig_resource(mig.profile), []).append(mig)
    return dict(sorted(groups.items())), None


def _single_strategy_problem(inventory: GpuInventory) -> str | None:
    plain = [gpu.whole.uuid for gpu in inventory.gpus if not gpu.mig_enabled]
    if plain:
        return f"MIG strategy single: GPUs without MIG mode: {', '.join(plain)}"
    empty = [gpu.whole.uuid for gpu in inventory.gpus if not gpu.mig_devices]
    if empty:
        return f"MIG strategy single: MIG-enabled GPUs without MIG devices: {', '.join(empty)}"
    profiles = sorted({mig.profile or "" for gpu in inventory.gpus for mig in gpu.mig_devices})
    if len(profiles) > 1:
        return f"MIG strategy single: more than one MIG profile: {', '.join(profiles)}"
    return None


def _devices(targets: Sequence[Target], replicas: int) -> list[GpuDevice]:
    if replicas == 1:
        return [GpuDevice(t.uuid, t.numa_node, t.gpu_uuid, target=t) for t in targets]
    return [
        GpuDevice(f"{t.uuid}{REPLICA_SEPARATOR}{n}", t.numa_node, t.gpu_uuid, target=t, replica=n)
        for t in targets
        for n in range(replicas)
    ]
