"""Which pods hold which GPUs: the answer to the remediation saga's `ListGpuHolders`.

`agent.NodeAgent` calls `answer` with the command, the kubelet's PodResources
(`gpuop.kubelet.allocations`) and the plugin's GPU inventory. The kubelet lists every
device id it gave a running container, exactly as a device plugin advertised it; each id of
a GPU resource (`nvidia.com/gpu`, `nvidia.com/gpu.shared`, `nvidia.com/mig-*`) is mapped back
to the physical GPUs it uses (`physical_gpus`):

    GPU-<uuid>                     that GPU
    MIG-<uuid>                     the GPU the MIG device is carved from
    <id>::<n>                      a time-sliced or MPS replica: as <id>
    <kind>/<class>=<name>          a CDI device name: as <name> (`all`: every GPU)
    <index>, <index>:<mig index>   the GPU at that NVML index (upstream's index strategy)

An id that maps to no GPU of the inventory (a MIG device of a layout since replaced, an
index the inventory does not have) counts its pod as a holder of every GPU asked about:
resetting a GPU under a running container costs more than waiting for one more pod. The
kubelet not answering is `GpuHoldersUnknown`: the saga cannot know whom to wait for.

Pods given a GPU through a DRA ResourceClaim, by gpuop's DRA driver or any other, hold it
too: `gpuop.inventory.claims.ClaimHolders` names the pods reserving a claim whose devices
are the GPUs asked about (from the cluster role's `dra.ClaimAllocated` facts), and the
answer names them beside the kubelet's device-plugin allocations.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from gpuop.events import remediation_commands
from gpuop.events.fields import NamespacedName
from gpuop.inventory.claims import ClaimHolders
from gpuop.kubelet.allocations import Allocation, PodResources, PodResourcesUnavailable
from gpuop.services.device_plugin.config import GPU_RESOURCE, MIG_RESOURCE_PREFIX
from gpuop.services.device_plugin.inventory import GpuInventory
from gpuop.services.device_plugin.resources import REPLICA_SEPARATOR

log = logging.getLogger(__name__)

CDI_SEPARATOR = "="
"""Between a CDI device's kind and its name: `nvidia.com/gpu=GPU-...`."""
ALL = "all"
"""The CDI device name of every GPU."""
_INDEX = re.compile(r"^(?P<gpu>\d{1,3})(?::\d{1,3})?$")

Answer = remediation_commands.GpuHoldersListed | remediation_commands.GpuHoldersUnknown


def is_gpu_resource(name: str) -> bool:
    """Whether the extended resource is one of the GPU resources this plugin can advertise."""
    return name.startswith((GPU_RESOURCE, MIG_RESOURCE_PREFIX))


def physical_gpus(device_id: str, inventory: GpuInventory) -> frozenset[str] | None:
    """The UUIDs of the GPUs behind `device_id`; None when it names none of the inventory's
    (a bare GPU UUID counts as itself even when the inventory does not list it)."""
    name = device_id.split(REPLICA_SEPARATOR, 1)[0]
    if CDI_SEPARATOR in name:
        name = name.rsplit(CDI_SEPARATOR, 1)[1]
    if name == ALL:
        return frozenset(gpu.whole.gpu_uuid for gpu in inventory.gpus) or None
    if name.startswith("GPU-"):
        return frozenset({name})
    for gpu in inventory.gpus:
        for target in (gpu.whole, *gpu.mig_devices):
            if target.uuid == name:
                return frozenset({target.gpu_uuid})
    index = _INDEX.match(name)
    if index is not None:
        for gpu in inventory.gpus:
            if gpu.whole.gpu_index == int(index["gpu"]):
                return frozenset({gpu.whole.gpu_uuid})
    return None


def pods_holding(
    allocations: Iterable[Allocation], inventory: GpuInventory, gpu_uuids: Iterable[str]
) -> tuple[NamespacedName, ...]:
    """The pods with a device of any of `gpu_uuids`, each once, sorted."""
    wanted = frozenset(gpu_uuids)
    found: set[tuple[str, str]] = set()
    for allocation in allocations:
        if not is_gpu_resource(allocation.resource_name):
            continue
        gpus = physical_gpus(allocation.device_id, inventory)
        if gpus is None:
            log.warning(
                "%s/%s holds %s %r, which names no GPU of this node: counted as a holder",
                allocation.namespace,
                allocation.pod,
                allocation.resource_name,
                allocation.device_id,
            )
        if gpus is None or gpus & wanted:
            found.add((allocation.namespace, allocation.pod))
    return tuple(NamespacedName(namespace=ns, name=pod) for ns, pod in sorted(found))


def with_claim_holders(
    pods: tuple[NamespacedName, ...], claims: ClaimHolders, gpu_uuids: Iterable[str]
) -> tuple[NamespacedName, ...]:
    """`pods` and the pods whose ResourceClaims hold any of `gpu_uuids`, each once, sorted."""
    found = {(pod.namespace, pod.name) for pod in pods}
    found.update((pod.namespace, pod.name) for pod in claims.pods_holding(gpu_uuids))
    return tuple(NamespacedName(namespace=ns, name=pod) for ns, pod in sorted(found))


async def answer(
    command_id: str,
    command: remediation_commands.ListGpuHolders,
    kubelet: PodResources,
    inventory: GpuInventory,
    claims: ClaimHolders | None = None,
) -> Answer:
    """The answer to one `ListGpuHolders`: the pods of the kubelet's allocations and of
    `claims` holding any of its GPUs."""
    try:
        allocations = await kubelet.allocations()
    except PodResourcesUnavailable as error:
        log.warning("cannot list the holders of %s: %s", " ".join(command.gpu_uuids), error)
        return remediation_commands.GpuHoldersUnknown(
            command_id=command_id, message=str(error)[:2048]
        )
    pods = pods_holding(allocations, inventory, command.gpu_uuids)
    if claims is not None:
        pods = with_claim_holders(pods, claims, command.gpu_uuids)
    if len(pods) > remediation_commands.MAX_PODS:
        message = f"{len(pods)} pods hold the GPUs, more than one answer names"
        return remediation_commands.GpuHoldersUnknown(command_id=command_id, message=message)
    return remediation_commands.GpuHoldersListed(
        command_id=command_id, gpu_uuids=command.gpu_uuids, pods=pods
    )
