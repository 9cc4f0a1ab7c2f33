"""Pods: which run on a node, which of them hold GPUs, and deleting one safely.

Called by the upgrade orchestrator (`wait-for-jobs-required` watches the pods of the nodes
that wait, `pod-deletion-required` removes the GPU pods) and by `draining`.

GPU pods are selected as the GPU Operator's `gpuPodSpecFilter` does: a container or init
container whose requests or limits name a resource starting with `nvidia.com/gpu` (which
also catches `nvidia.com/gpu.shared` and other renamed shared resources) or
`nvidia.com/mig-`, in a pod that is Running or Pending. Pod selectors are label selector
strings, applied by the server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.kube import errors
from gpuop.kube.client import Kube
from gpuop.kube.watching import ListWatch

Obj = dict[str, Any]

GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
"""Extended resources that mean "this pod holds NVIDIA GPUs or MIG slices"."""
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
