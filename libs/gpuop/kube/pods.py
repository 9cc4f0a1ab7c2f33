"""Pods: which run on a node, which of them hold the devices of a driver, deleting one safely.

Called by the upgrade orchestrator (`wait-for-jobs-required` watches the pods of the nodes
that wait, `pod-deletion-required` removes the pods holding a device of the components it
upgrades) and by `draining`.

GPU pods are selected as the GPU Operator's `gpuPodSpecFilter` does: a container or init
container whose requests or limits name a resource starting with `nvidia.com/gpu` (which
also catches `nvidia.com/gpu.shared` and other renamed shared resources) or
`nvidia.com/mig-`, in a pod that is Running or Pending (`uses_gpu`). Pod selectors are label
selector strings, applied by the server.

The pod-deletion step of a driver upgrade deletes the pods that hold a device of a driver it
reloads (`holds`, `holders_filter`), per component (`COMPONENT_RESOURCE_PREFIXES`):

    gpu   the GPU resources above, and DRA ResourceClaims (resource.k8s.io/v1) allocated
          by NVIDIA's DRA drivers `gpu.nvidia.com` and `compute-domain.nvidia.com`
          (`GPU_DRA_DRIVERS`): the claims a pod names in `spec.resourceClaims`, directly or
          made from a template (`status.resourceClaimStatuses`), whose
          `status.allocation.devices.results[].driver` is one of them; and the pods
          reserving a claim of any other driver whose devices are the node's GPUs, as the
          device plugin's cluster role matched them (`holders_filter`'s `gpu_claimants`)
    ofed  RDMA and SR-IOV resources (`RDMA_RESOURCE_PREFIXES`, `SRIOV_RESOURCE_PREFIXES`)

So a GPU-only upgrade leaves a pod that holds only an RDMA device running, and an OFED upgrade
deletes it before the NIC driver is unloaded under it. The Network Operator can also publish
SR-IOV and RDMA resources under `nvidia.com/` (its `resourcePrefix` setting, e.g.
`nvidia.com/hostdev`): those names cannot be told from the GPU Operator's own `nvidia.com/`
resources by their name, so they are not selected; pods holding them leave with the drain
(`drain.enable`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events.driver import Component
from gpuop.kube import errors
from gpuop.kube.client import Kube
from gpuop.kube.watching import ListWatch

Obj = dict[str, Any]

GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
"""Extended resources that mean "this pod holds NVIDIA GPUs or MIG slices"."""
RDMA_RESOURCE_PREFIXES = ("rdma/",)
"""RDMA devices: the prefix the Mellanox RDMA shared device plugin advertises its resources
under by default (`rdma/rdma_shared_device_a` in the Network Operator's examples, and
gpuop's own device plugin's `rdma/<resourceName>`)."""
SRIOV_RESOURCE_PREFIXES = ("openshift.io/", "intel.com/")
"""SR-IOV virtual functions, under the default prefixes of the two projects that publish
them: the SR-IOV Network Operator's (`openshift.io/`, as in `openshift.io/mlxnics` for
ConnectX VFs) and the SR-IOV Network Device Plugin's own `--resource-prefix` (`intel.com/`,
whatever the NIC's vendor, as in its `intel.com/mlnx_sriov_rdma` example)."""
COMPONENT_RESOURCE_PREFIXES: Mapping[Component, tuple[str, ...]] = MappingProxyType(
    {
        Component.GPU: GPU_RESOURCE_PREFIXES,
        Component.OFED: RDMA_RESOURCE_PREFIXES + SRIOV_RESOURCE_PREFIXES,
    }
)
"""Per component: the extended resources whose devices its driver serves."""
GPU_DRA_DRIVERS = frozenset({"gpu.nvidia.com", "compute-domain.nvidia.com"})
"""NVIDIA's DRA drivers (k8s-dra-driver-gpu): GPUs and MIG devices, and IMEX channels of a
compute domain; both stop working when the GPU driver is unloaded."""
COMPONENT_DRA_DRIVERS: Mapping[Component, frozenset[str]] = MappingProxyType(
    {Component.GPU: GPU_DRA_DRIVERS, Component.OFED: frozenset()}
)
"""Per component: the DRA drivers whose allocations its driver serves."""
ACTIVE_PHASES = frozenset({"Running", "Pending"})
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, order=True)
class PodRef:
    """One pod incarnation: a pod recreated under the same name has another uid."""

    namespace: str
    name: str
    uid: str = ""

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodRef:
        metadata = pod.get("metadata") or {}
        return cls(
            str(metadata.get("namespace") or ""),
            str(metadata.get("name") or ""),
            str(metadata.get("uid") or ""),
        )

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def is_finished(pod: Mapping[str, Any]) -> bool:
    return phase(pod) in FINISHED_PHASES


def is_terminating(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def controller_of(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference marked `controller: true`, if any."""
    for owner in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("controller"):
            return dict(owner)
    return None


def requested_resources(pod: Mapping[str, Any]) -> frozenset[str]:
    """Every resource named in the requests or limits of any container or init container."""
    spec = pod.get("spec") or {}
    names: set[str] = set()
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        for section in ("requests", "limits"):
            names.update((resources.get(section) or {}).keys())
    return frozenset(names)


def gpu_resources(pod: Mapping[str, Any]) -> frozenset[str]:
    return frozenset(
        name for name in requested_resources(pod) if name.startswith(GPU_RESOURCE_PREFIXES)
    )


def uses_gpu(pod: Mapping[str, Any]) -> bool:
    """Whether the pod holds GPUs: it asks for a GPU resource and has not finished."""
    return phase(pod) in ACTIVE_PHASES and bool(gpu_resources(pod))


ClaimRef = tuple[str, str]
"""A ResourceClaim: namespace, name."""


def claims_of(pod: Mapping[str, Any]) -> tuple[ClaimRef, ...]:
    """The ResourceClaims the pod uses: those `spec.resourceClaims` names directly
    (`resourceClaimName`), and those made for it from a template, by the names
    `status.resourceClaimStatuses` reports (none yet: no claim to hold)."""
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    made = {
        str(entry.get("name")): entry.get("resourceClaimName")
        for entry in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    found: list[ClaimRef] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = entry.get("resourceClaimName") or made.get(str(entry.get("name")))
        if name:
            found.append((namespace, str(name)))
    return tuple(dict.fromkeys(found))


def allocated_drivers(claim: Mapping[str, Any]) -> frozenset[str]:
    """The DRA drivers of the devices allocated to a ResourceClaim
    (`status.allocation.devices.results[].driver`); none while it is not allocated."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return frozenset(str(result["driver"]) for result in results if result.get("driver"))


async def claim_drivers(kube: Kube, claims: Iterable[ClaimRef]) -> dict[ClaimRef, frozenset[str]]:
    """The allocated drivers of each claim, read once each (`resource.k8s.io/v1`, served
    from Kubernetes 1.34, where DRA is generally available). A claim that is gone holds
    nothing; any other failure raises its `KubeError`."""
    drivers: dict[ClaimRef, frozenset[str]] = {}
    for namespace, name in sorted(set(claims)):
        try:
            claim = await kube.call(kube.resource.read_namespaced_resource_claim, name, namespace)
        except errors.NotFound:
            claim = {}
        drivers[(namespace, name)] = allocated_drivers(claim)
    return drivers


def holds(
    pod: Mapping[str, Any],
    components: Collection[Component],
    claims: Mapping[ClaimRef, frozenset[str]] | None = None,
) -> bool:
    """Whether the pod, Running or Pending, holds a device of one of `components`' drivers:
    it requests one of their resources (`COMPONENT_RESOURCE_PREFIXES`), or one of its claims is
    allocated by one of their DRA drivers (`claims`: the allocated drivers of each claim, as
    `claim_drivers` reads them; a claim not in it counts as holding nothing)."""
    if phase(pod) not in ACTIVE_PHASES:
        return False
    prefixes = tuple(p for c in components for p in COMPONENT_RESOURCE_PREFIXES[c])
    if any(name.startswith(prefixes) for name in requested_resources(pod)):
        return True
    dra = frozenset().union(*(COMPONENT_DRA_DRIVERS[c] for c in components))
    known = claims or {}
    return any(known.get(ref, frozenset()) & dra for ref in claims_of(pod))


async def holders_filter(
    kube: Kube,
    components: Collection[Component],
    node_pods: Iterable[Mapping[str, Any]],
    gpu_claimants: Collection[tuple[str, str]] = frozenset(),
) -> Callable[[Mapping[str, Any]], bool]:
    """`holds` for `components`, as a drain's pod filter over `node_pods`: the claims the
    unfinished ones use are read first, once each, so a node whose pods use no claim costs
    no request. With the GPU among `components`, a Running or Pending pod of
    `gpu_claimants` (namespace, name: the pods that reserve a ResourceClaim whose devices,
    of any DRA driver, are the node's GPUs, as the device plugin's cluster role publishes
    them in `dra.ClaimAllocated`) holds one too."""
    wanted = [ref for pod in node_pods if phase(pod) in ACTIVE_PHASES for ref in claims_of(pod)]
    needs_claims = any(COMPONENT_DRA_DRIVERS[c] for c in components)
    claims = await claim_drivers(kube, wanted) if wanted and needs_claims else {}
    chosen = frozenset(components)
    claimants = frozenset(gpu_claimants) if Component.GPU in chosen else frozenset()

    def accept(pod: Mapping[str, Any]) -> bool:
        if holds(pod, chosen, claims):
            return True
        ref = PodRef.of(pod)
        return phase(pod) in ACTIVE_PHASES and (ref.namespace, ref.name) in claimants

    return accept


async def on_node(
    kube: Kube, node: str, *, label_selector: str | None = None, namespace: str | None = None
) -> list[Obj]:
    """The pods bound to `node` (in every namespace unless one is given) that match
    `label_selector`, sorted by namespace and name."""
    selectors: dict[str, str] = {"field_selector": f"spec.nodeName={node}"}
    if label_selector:
        selectors["label_selector"] = label_selector
    if namespace is None:
        listed = await kube.call(kube.core.list_pod_for_all_namespaces, **selectors)
    else:
        listed = await kube.call(kube.core.list_namespaced_pod, namespace, **selectors)
    items: list[Obj] = listed.get("items") or []
    return sorted(items, key=PodRef.of)


def watch_on_node(
    kube: Kube, node: str, *, label_selector: str | None = None, clock: Clock = SYSTEM_CLOCK
) -> ListWatch:
    """A list-watch of the pods bound to `node` (every namespace) that match
    `label_selector`: one LIST, then one WATCH for every later change, where polling
    `on_node` would LIST again each time."""
    return ListWatch(
        kube,
        kube.core.list_pod_for_all_namespaces,
        field_selector=f"spec.nodeName={node}",
        label_selector=label_selector or None,
        clock=clock,
    )


async def gpu_pods_on(kube: Kube, node: str, *, label_selector: str | None = None) -> list[Obj]:
    """The pods on `node` that hold GPUs, optionally narrowed by a label selector."""
    return [
        pod for pod in await on_node(kube, node, label_selector=label_selector) if uses_gpu(pod)
    ]


async def delete(kube: Kube, pod: PodRef, *, grace_period_seconds: int | None = None) -> bool:
    """Delete this incarnation of the pod (never a successor with the same name), with its
    own grace period unless one is given. Returns False when it was already gone."""
    options: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
    if pod.uid:
        options["preconditions"] = {"uid": pod.uid}
    if grace_period_seconds is not None:
        options["gracePeriodSeconds"] = grace_period_seconds
    try:
        await kube.call(kube.core.delete_namespaced_pod, pod.name, pod.namespace, body=options)
    except errors.NotFound:
        return False
    except errors.Conflict:
        return False  # the uid precondition failed: this incarnation is gone
    return True
