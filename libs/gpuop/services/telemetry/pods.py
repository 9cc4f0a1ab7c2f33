"""Which container holds which GPU: the kubelet's PodResources answer, turned into pod labels.

The node exporter asks a `PodResourcesSource` on its own loop (never per scrape) and
re-renders the GPU labels only when `attribute()` gives a different answer. The kubelet
source (`kubelet_pods.KubeletPodResources`) calls PodResources `List` over the kubelet's
unix socket; `InMemoryPodResources` stands in for it in tests and the benchmark.

Device ids are whatever the device plugin advertised, so every form is accepted: a GPU
UUID, a time-slicing replica `<uuid>::<n>` (the replica maps back to its GPU), a MIG device
UUID (attributed to its parent GPU, and to its MIG GPU instance: `attribute_instances`),
an index `3` or a device name `nvidia3`. Ids of other
resources, and ids that match no GPU of this node, are ignored. `Attributor` asks the
source and reports, once per change rather than once per refresh, when it cannot.

A GPU given to a pod through a DRA ResourceClaim (gpuop's driver or any other) is not in
those device ids: `Attributor` adds the pods reserving a claim of each GPU, from the node's
`dra.ClaimAllocated` facts (`gpuop.inventory.claims`, `with_claim_holders`). A claim names
its pods, not their containers, so such an owner's `container` is empty; a pod the kubelet
already named for that GPU is not added twice. With the `pod_uid` label on, each owner also
carries its pod's uid (`pod_uids`, or the claim's for a DRA pod).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from prometheus_client import Gauge

from gpuop.inventory.claims import ClaimHolders
from gpuop.kubelet.allocations import PodResourcesUnavailable as PodResourcesUnavailable
from gpuop.nvml import DeviceInfo, MigDevice
from gpuop.services.telemetry.pod_uids import PodKey, PodUids
from gpuop.services.telemetry.sessions import Inventory

log = logging.getLogger(__name__)

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
REPLICA_SEPARATOR = "::"
"""Between a GPU's UUID and the replica number in a time-sliced device id."""


@dataclass(frozen=True, slots=True, order=True)
class Owner:
    """A container the kubelet gave a device to."""

    namespace: str
    pod: str
    container: str
    uid: str = ""
    """The pod's uid where known (`pod_uids`); empty otherwise."""


@dataclass(frozen=True, slots=True)
class DeviceAssignment:
    """One device id of one extended resource, given to one container."""

    resource_name: str
    """`nvidia.com/gpu`, `nvidia.com/mig-1g.18gb`, `rdma/rdma_shared_device_a`, ..."""
    device_id: str
    """The id the device plugin advertised."""
    owner: Owner


class PodResourcesSource(Protocol):
    """Who holds which device on this node, as the kubelet says."""

    async def assignments(self) -> tuple[DeviceAssignment, ...]:
        """Every device of every running container. Raises `PodResourcesUnavailable`."""
        ...

    async def close(self) -> None:
        """Let go of the connection; a later `assignments()` connects again."""
        ...


class InMemoryPodResources:
    """A `PodResourcesSource` answering what it was last told; `unavailable` makes it fail."""

    def __init__(self, assignments: Iterable[DeviceAssignment] = ()) -> None:
        self.current = tuple(assignments)
        self.unavailable: str | None = None
        """When set, `assignments()` raises `PodResourcesUnavailable` with this message."""
        self.calls = 0

    async def assignments(self) -> tuple[DeviceAssignment, ...]:
        self.calls += 1
        if self.unavailable is not None:
            raise PodResourcesUnavailable(self.unavailable)
        return self.current

    async def close(self) -> None:
        pass


InstanceKey = tuple[int, int]
"""A MIG GPU instance: its GPU's NVML index and its `GPU_I_ID`."""
Attribution = Mapping[int | InstanceKey, tuple[Owner, ...]]
"""The containers holding each GPU, by NVML index, and each MIG GPU instance, by
`InstanceKey`, sorted; GPUs and instances nobody holds are absent."""


def device_ids(gpus: Sequence[DeviceInfo], migs: Iterable[MigDevice] = ()) -> dict[str, int]:
    """Every id a device plugin may advertise for this node's GPUs, to the GPU's index."""
    ids: dict[str, int] = {}
    for gpu in gpus:
        ids[gpu.uuid] = gpu.index
        ids[str(gpu.index)] = gpu.index
        ids[f"nvidia{gpu.index}"] = gpu.index
    for mig in migs:
        ids[mig.uuid] = mig.parent_index
    return ids


def is_gpu_resource(resource_name: str, resource_names: Iterable[str]) -> bool:
    """Whether devices of `resource_name` are GPUs (or MIG devices of one)."""
    return resource_name.startswith(MIG_RESOURCE_PREFIX) or resource_name in resource_names


def attribute(
    assignments: Iterable[DeviceAssignment],
    ids: Mapping[str, int],
    resource_names: Iterable[str],
) -> dict[int, tuple[Owner, ...]]:
    """The containers holding each GPU."""
    names = frozenset(resource_names)
    owners: dict[int, set[Owner]] = {}
    for assignment in assignments:
        if not is_gpu_resource(assignment.resource_name, names):
            continue
        device_id = assignment.device_id.partition(REPLICA_SEPARATOR)[0]
        index = ids.get(device_id)
        if index is not None:
            owners.setdefault(index, set()).add(assignment.owner)
    return {index: tuple(sorted(found)) for index, found in sorted(owners.items())}


def attribute_instances(
    assignments: Iterable[DeviceAssignment],
    migs: Iterable[MigDevice],
    resource_names: Iterable[str],
) -> dict[InstanceKey, tuple[Owner, ...]]:
    """The containers holding each MIG GPU instance (through one of its MIG devices)."""
    names = frozenset(resource_names)
    instance_of = {mig.uuid: (mig.parent_index, mig.gpu_instance_id) for mig in migs}
    owners: dict[InstanceKey, set[Owner]] = {}
    for assignment in assignments:
        key = instance_of.get(assignment.device_id.partition(REPLICA_SEPARATOR)[0])
        if key is not None and is_gpu_resource(assignment.resource_name, names):
            owners.setdefault(key, set()).add(assignment.owner)
    return {key: tuple(sorted(found)) for key, found in sorted(owners.items())}


def with_claim_holders(
    attribution: Attribution, claims: ClaimHolders, gpus: Sequence[DeviceInfo]
) -> dict[int | InstanceKey, tuple[Owner, ...]]:
    """`attribution` and, for each GPU of `gpus`, the pods reserving a claim of it."""
    index_of = {gpu.uuid: gpu.index for gpu in gpus}
    owners: dict[int | InstanceKey, set[Owner]] = {
        key: set(found) for key, found in attribution.items()
    }
    for gpu_uuid, holders in claims.pods_by_gpu().items():
        index = index_of.get(gpu_uuid)
        if index is None:
            continue
        found = owners.setdefault(index, set())
        named = {(owner.namespace, owner.pod) for owner in found}
        found.update(
            Owner(pod.namespace, pod.name, "", pod.uid)
            for pod in holders
            if (pod.namespace, pod.name) not in named
        )
    return {key: tuple(sorted(found)) for key, found in owners.items()}


class Attributor:
    """Asks a `PodResourcesSource` who holds this node's GPUs; `up` is set to 1 while the
    kubelet answers and 0 while it cannot be asked (the last answer then stays in force);
    the pods of `claims`' ResourceClaims are added to each answer."""

    def __init__(
        self,
        source: PodResourcesSource,
        resource_names: Iterable[str],
        up: Gauge,
        claims: ClaimHolders | None = None,
        uids: PodUids | None = None,
    ) -> None:
        self.source = source
        self.claims = claims
        self.uids = uids
        """Where the pods' uids come from, when the `pod_uid` label is on."""
        self._resource_names = tuple(resource_names)
        self._up = up
        self._answering: bool | None = None

    async def refresh(self, inventory: Inventory) -> Attribution | None:
        """The containers holding each GPU and MIG GPU instance of `inventory`; None when
        the kubelet failed."""
        try:
            assignments = await self.source.assignments()
        except PodResourcesUnavailable as error:
            if self._answering is not False:
                log.warning("no pod labels: the kubelet's PodResources failed: %s", error)
            self._answering = False
            self._up.set(0)
            return None
        if self._answering is False:
            log.info("the kubelet's PodResources answers again")
        self._answering = True
        self._up.set(1)
        ids = device_ids(inventory.gpus, inventory.migs)
        holders: dict[int | InstanceKey, tuple[Owner, ...]] = {}
        for index, owners in attribute(assignments, ids, self._resource_names).items():
            holders[index] = owners
        instances = attribute_instances(assignments, inventory.migs, self._resource_names)
        for key, owners in instances.items():
            holders[key] = owners
        found: Attribution = holders
        if self.uids is not None:
            found = with_uids(found, self.uids.read())
        if self.claims is None:
            return found
        return with_claim_holders(found, self.claims, inventory.gpus)


def with_uids(attribution: Attribution, uids: Mapping[PodKey, str]) -> Attribution:
    """`attribution` with each owner's pod uid, where `uids` knows it."""
    return {
        key: tuple(
            replace(owner, uid=uids.get((owner.namespace, owner.pod), owner.uid))
            for owner in owners
        )
        for key, owners in attribution.items()
    }
