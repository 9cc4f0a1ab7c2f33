"""Dynamic Resource Allocation's objects (`resource.k8s.io/v1`): slices, claims, taint rules.

Called by the device plugin's cluster role (it writes each DRA node's ResourceSlices and
watches them and the ResourceClaims) and by the sagas that quarantine one device
(`DeviceTaintRule`s). Slices are cluster-scoped and carry their pool's node in
`spec.nodeName`; the calls here select them by driver and node with the API server's field
selectors (`spec.driver`, `spec.nodeName`, `spec.pool.name`).

Writes that depend on what was read carry it: `replace_slice` sends the read
`resourceVersion` (a 409 `Conflict` when the slice changed since), `delete_slice` a uid and
resourceVersion precondition, so a slice the kubelet wiped and the cluster role made again
is never deleted by a decision taken on the old one. Creates answer 409 `AlreadyExists`
when the name is taken. Taint rules are named from the node and device, so putting the same
one twice is one object (`put_taint_rule` creates, or replaces what differs).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.kube import errors
from gpuop.kube.client import Kube
from gpuop.kube.watching import ListWatch

Obj = dict[str, Any]

API_VERSION = "resource.k8s.io/v1"
TAINT_RULE_PREFIX = "gpuop-"
"""Every DeviceTaintRule gpuop writes is named `gpuop-<node>-<device>` (hashed when long)."""
MAX_NAME = 253


def slice_selector(*, driver: str, node: str | None = None, pool: str | None = None) -> str:
    """The field selector of a driver's slices, optionally of one node or pool."""
    terms = [f"spec.driver={driver}"]
    if node is not None:
        terms.append(f"spec.nodeName={node}")
    if pool is not None:
        terms.append(f"spec.pool.name={pool}")
    return ",".join(terms)


async def list_slices(
    kube: Kube, *, driver: str, node: str | None = None, pool: str | None = None
) -> list[Obj]:
    """A driver's ResourceSlices (of one node or pool when given), sorted by name."""
    listed = await kube.call(
        kube.resource.list_resource_slice,
        field_selector=slice_selector(driver=driver, node=node, pool=pool),
    )
    items: list[Obj] = listed.get("items") or []
    return sorted(items, key=lambda item: str(item["metadata"]["name"]))


def watch_slices(kube: Kube, *, driver: str, clock: Clock = SYSTEM_CLOCK) -> ListWatch:
    """A list-watch of every ResourceSlice of `driver`, all nodes."""
    return ListWatch(
        kube,
        kube.resource.list_resource_slice,
        field_selector=slice_selector(driver=driver),
        clock=clock,
    )


async def create_slice(kube: Kube, body: Obj) -> Obj:
    """Create a ResourceSlice (a `name` or a `generateName`); returns it as stored."""
    return await kube.call(kube.resource.create_resource_slice, body)


async def replace_slice(kube: Kube, body: Obj) -> Obj:
    """Replace a ResourceSlice; `body.metadata.resourceVersion` is the version it was decided
    on, and the server answers `Conflict` when the slice changed since."""
    name = str(body["metadata"]["name"])
    return await kube.call(kube.resource.replace_resource_slice, name, body)


async def delete_slice(kube: Kube, known: Mapping[str, Any]) -> bool:
    """Delete the slice as it was read (uid and resourceVersion preconditions); False when it
    was already gone. A `Conflict` means it changed since: read it again and decide again."""
    metadata = known.get("metadata") or {}
    preconditions = {"uid": metadata.get("uid"), "resourceVersion": metadata.get("resourceVersion")}
    options: Obj = {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": {key: value for key, value in preconditions.items() if value},
    }
    try:
        await kube.call(kube.resource.delete_resource_slice, str(metadata["name"]), body=options)
    except errors.NotFound:
        return False
    return True


def watch_claims(kube: Kube, *, clock: Clock = SYSTEM_CLOCK) -> ListWatch:
    """A list-watch of every ResourceClaim, all namespaces."""
    return ListWatch(kube, kube.resource.list_resource_claim_for_all_namespaces, clock=clock)


async def list_claims(kube: Kube) -> list[Obj]:
    """Every ResourceClaim, all namespaces."""
    listed = await kube.call(kube.resource.list_resource_claim_for_all_namespaces)
    items: list[Obj] = listed.get("items") or []
    return items


def allocation_results(claim: Mapping[str, Any]) -> list[Obj]:
    """`status.allocation.devices.results` of a claim; empty while it is not allocated."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results: list[Obj] = (allocation.get("devices") or {}).get("results") or []
    return results


def taint_rule_name(node: str, device: str) -> str:
    """The DeviceTaintRule gpuop writes for one device of one node's pool: the same name every
    time, so a repeated quarantine finds its rule and a release deletes exactly it."""
    name = f"{TAINT_RULE_PREFIX}{node}-{device}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(f"{node}/{device}".encode()).hexdigest()[:16]
    return f"{name[: MAX_NAME - len(digest) - 1]}-{digest}"


def taint_rule(
    *, driver: str, node: str, device: str, key: str, effect: str = "NoSchedule", value: str = ""
) -> Obj:
    """The DeviceTaintRule tainting one device of `node`'s pool (gpuop's pools are named
    after their nodes)."""
    taint: Obj = {"key": key, "effect": effect}
    if value:
        taint["value"] = value
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": taint_rule_name(node, device),
            "labels": {"app.kubernetes.io/managed-by": "gpuop"},
        },
        "spec": {
            "deviceSelector": {"driver": driver, "pool": node, "device": device},
            "taint": taint,
        },
    }


async def put_taint_rule(kube: Kube, rule: Obj) -> Obj:
    """Create the rule, or replace the one of that name when its spec differs."""
    name = str(rule["metadata"]["name"])
    try:
        return await kube.call(kube.resource.create_device_taint_rule, rule)
    except errors.AlreadyExists:
        pass
    current = await kube.call(kube.resource.read_device_taint_rule, name)
    wanted_taint = rule["spec"]["taint"]
    taint = (current.get("spec") or {}).get("taint") or {}
    same_taint = all(taint.get(k) == v for k, v in wanted_taint.items())
    if (current.get("spec") or {}).get("deviceSelector") == rule["spec"]["deviceSelector"] and (
        same_taint
    ):
        return current
    body = {**rule, "metadata": {**rule["metadata"], **_version_of(current)}}
    return await kube.call(kube.resource.replace_device_taint_rule, name, body)


def _version_of(obj: Mapping[str, Any]) -> Obj:
    return {"resourceVersion": (obj.get("metadata") or {}).get("resourceVersion")}


async def delete_taint_rule(kube: Kube, name: str) -> bool:
    """Delete a DeviceTaintRule; False when it was already gone."""
    try:
        await kube.call(kube.resource.delete_device_taint_rule, name)
    except errors.NotFound:
        return False
    return True


async def list_taint_rules(kube: Kube) -> list[Obj]:
    """Every DeviceTaintRule."""
    listed = await kube.call(kube.resource.list_device_taint_rule)
    items: list[Obj] = listed.get("items") or []
    return items
