"""Object builders for the `gpuop.kube` suite; tests seed them into the simulated server."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def node(name: str, *, unschedulable: bool = False, labels: dict[str, str] | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod(
    name: str,
    *,
    node: str | None = "node-1",
    namespace: str = "default",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owner: str | None = "ReplicaSet",
    resources: dict[str, Any] | None = None,
    init_resources: dict[str, Any] | None = None,
    volumes: list[Obj] | None = None,
    phase: str = "Running",
) -> Obj:
    """A pod as the kubelet reports it: Running and Ready unless `phase` says otherwise,
    controlled by a `owner` (None: unmanaged)."""
    spec: Obj = {
        "containers": [
            {"name": "main", "image": "registry.example/app:1.0", "resources": resources or {}}
        ]
    }
    if init_resources is not None:
        spec["initContainers"] = [
            {"name": "init", "image": "registry.example/init:1.0", "resources": init_resources}
        ]
    if node is not None:
        spec["nodeName"] = node
    if volumes:
        spec["volumes"] = volumes
    metadata: Obj = {
        "name": name,
        "namespace": namespace,
        "labels": labels or {},
        "annotations": annotations or {},
    }
    if owner is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": owner,
                "name": f"{name}-owner",
                "uid": f"uid-of-{name}-owner",
                "controller": True,
            }
        ]
    ready = "True" if phase == "Running" else "False"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]},
    }


def gpus(count: int = 1, resource: str = "nvidia.com/gpu") -> Obj:
    return {"limits": {resource: str(count)}, "requests": {resource: str(count)}}


def pdb(
    name: str, selector: dict[str, str], *, min_available: int, namespace: str = "default"
) -> Obj:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"matchLabels": selector}, "minAvailable": min_available},
    }


def claim(name: str, *drivers: str, namespace: str = "default") -> Obj:
    """A ResourceClaim as the scheduler leaves it: allocated one device per driver named
    (none: not allocated yet)."""
    obj: Obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "device"}]}},
    }
    if drivers:
        results = [
            {"request": "device", "driver": driver, "pool": "node-1", "device": f"dev-{i}"}
            for i, driver in enumerate(drivers)
        ]
        obj["status"] = {"allocation": {"devices": {"results": results}}}
    return obj


def with_claims(
    pod: Obj, *, named: dict[str, str] | None = None, made: dict[str, str] | None = None
) -> Obj:
    """`pod` using ResourceClaims: `named` maps the pod's claim entry to a claim it names
    (`resourceClaimName`), `made` to the claim made for it from a template, as the pod's
    status reports it."""
    entries = [
        {"name": entry, "resourceClaimName": claim} for entry, claim in (named or {}).items()
    ]
    entries += [{"name": entry, "resourceClaimTemplateName": "template"} for entry in made or {}]
    pod["spec"]["resourceClaims"] = entries
    if made:
        pod["status"]["resourceClaimStatuses"] = [
            {"name": entry, "resourceClaimName": claim} for entry, claim in made.items()
        ]
    return pod
