"""The simulated scheduler's Dynamic Resource Allocation: a pending pod's ResourceClaims
allocated from the ResourceSlices of the node it is bound to, as kube-scheduler's
DynamicResources plugin does, in its simplest form.

Called by ``scheduling.Scheduler`` for each pod that names claims (``spec.resourceClaims``):
``fits`` filters the nodes, ``allocate`` writes the allocation once a node is chosen.

- A pod's claim is the one its entry names (``resourceClaimName``), or one made from its
  template (``resourceClaimTemplateName``): ``<pod>-<entry>``, owned by the pod, recorded in
  the pod's ``status.resourceClaimStatuses`` (the resource claim controller's work).
- A request ``exactly {deviceClassName, count}`` takes devices of the node's slices
  (``spec.nodeName``) that its class admits. The class's CEL is not evaluated: NVIDIA's
  classes are known by name (``CLASS_TYPES``: ``gpu.nvidia.com`` takes the devices whose
  attribute ``type`` is ``gpu``, ``mig.nvidia.com`` ``mig``), and a class or a request
  selector the simulation cannot read makes the claim unallocatable here, never wrongly
  allocated. The one selector it reads is the validation pod's, naming GPUs by UUID
  (``device.attributes['gpu.nvidia.com'].uuid in ['GPU-…', …]``).
- ``allocationMode: All`` (the preflight diagnostic's claim) takes every device of the class
  in the node's slices, and none when one of them is held or tainted past its tolerations,
  as kube-scheduler does.
- A device another allocated claim holds, or a DeviceTaintRule taints ``NoSchedule`` or
  ``NoExecute``, is not given, unless the request tolerates that taint's key (``Exists``).
- The allocation (``status.allocation.devices.results``: request, driver, pool, device, and
  the node selector) and the pod in ``status.reservedFor`` go to the claim's status, which
  the device plugin's cluster role reads to tell the node.
"""

from __future__ import annotations

import re
from typing import Any

from gpuop_sim.apiserver import dra_kinds, kinds
from gpuop_sim.apiserver.registry import Registry
from gpuop_sim.cluster.wakeups import unless_gone

Obj = dict[str, Any]
Device = tuple[str, str, str]
"""A device as allocations name it: (driver, pool, device)."""

CLASS_TYPES = {"gpu.nvidia.com": "gpu", "mig.nvidia.com": "mig"}
"""NVIDIA's DeviceClasses by name: the value of the device attribute ``type`` each admits."""
_TAINTING = ("NoSchedule", "NoExecute")


def wants_claims(pod: Obj) -> bool:
    return bool((pod.get("spec") or {}).get("resourceClaims"))


class Claims:
    """The claims of pending pods, allocated against one registry's slices."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def _claim(self, pod: Obj, entry: Obj) -> Obj | None:
        store = self._registry.store
        namespace = pod["metadata"].get("namespace", "")
        name = entry.get("resourceClaimName") or _generated(pod, entry)
        return store.get(kinds.RESOURCECLAIMS.group_resource, namespace, name)

    def _held(self) -> set[Device]:
        """Devices allocated to a claim already."""
        held: set[Device] = set()
        for claim in self._registry.store.view(kinds.RESOURCECLAIMS.group_resource):
            for result in _results(claim):
                held.add((result["driver"], result["pool"], result["device"]))
        return held

    def _tainted(self) -> list[tuple[Obj, str]]:
        """The device selectors of the DeviceTaintRules that keep new claims off, each with
        its taint's key."""
        rules = self._registry.store.view(dra_kinds.DEVICETAINTRULES.group_resource)
        found = []
        for rule in rules:
            spec = rule.get("spec") or {}
            taint = spec.get("taint") or {}
            if taint.get("effect") in _TAINTING:
                found.append((spec.get("deviceSelector") or {}, str(taint.get("key", ""))))
        return found

    def _free(self, node: str, held: set[Device]) -> list[tuple[Device, Obj, frozenset[str]]]:
        """The devices of `node`'s slices no claim holds, each with the keys of the taints
        that keep new claims off it."""
        tainted = self._tainted()
        found = []
        for slice_ in self._registry.store.view(dra_kinds.RESOURCESLICES.group_resource):
            spec = slice_.get("spec") or {}
            if spec.get("nodeName") != node:
                continue
            driver, pool = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
            for device in spec.get("devices") or []:
                key = (driver, pool, device.get("name", ""))
                if key not in held:
                    taints = frozenset(k for s, k in tainted if _selects(s, key))
                    found.append((key, device, taints))
        return found

    def plan(self, pod: Obj, node: str) -> list[tuple[Obj | None, Obj, list[Obj]]] | None:
        """Per claim entry of `pod`, the devices `node` gives each request, or None when it
        cannot give them all (a claim allocated already keeps its devices)."""
        held = self._held()
        planned: list[tuple[Obj | None, Obj, list[Obj]]] = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
            claim = self._claim(pod, entry)
            if claim is not None and _results(claim):
                continue
            spec = claim.get("spec") if claim is not None else self._template_spec(pod, entry)
            if spec is None:
                return None
            results: list[Obj] = []
            free = self._free(node, held)
            for request in ((spec.get("devices") or {}).get("requests")) or []:
                exactly = request.get("exactly") or {}
                wanted = CLASS_TYPES.get(exactly.get("deviceClassName", ""))
                uuids = _uuids_selected(exactly.get("selectors") or [])
                if wanted is None or uuids is None:
                    return None
                tolerated = _tolerated(exactly.get("tolerations") or [])
                count = int(exactly.get("count", 1))
                fitting = [
                    (key, d)
                    for key, d, taints in free
                    if _type(d) == wanted
                    and taints <= tolerated
                    and (not uuids or _attribute(d, "uuid") in uuids)
                ]
                if exactly.get("allocationMode") == "All":
                    count = sum(_type(d) == wanted for _, d, _ in self._free(node, set()))
                if not count or len(fitting) < count:
                    return None
                fitting = fitting[:count]
                for key, _ in fitting:
                    held.add(key)
                    free = [(k, d, t) for k, d, t in free if k != key]
                    results.append(
                        {"request": request["name"], "driver": key[0], "pool": key[1],
                         "device": key[2]}
                    )  # fmt: skip
            planned.append((claim, entry, results))
        return planned

    def fits(self, pod: Obj, node: str) -> bool:
        return self.plan(pod, node) is not None

    def allocate(self, pod: Obj, node: str) -> None:
        """Write the allocation `plan` made for `pod` on `node` (claims from templates made
        first)."""
        planned = self.plan(pod, node)
        if planned is None:
            return
        namespace = pod["metadata"].get("namespace", "")
        statuses = []
        for claim, entry, results in planned:
            if claim is None:
                claim = self._made(pod, entry)
            name = claim["metadata"]["name"]
            statuses.append({"name": entry["name"], "resourceClaimName": name})
            allocation = {
                "devices": {"results": results},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
            }  # fmt: skip
            reserved = {"resource": "pods", "name": pod["metadata"]["name"],
                        "uid": pod["metadata"].get("uid", "")}  # fmt: skip

            def allocated(obj: Obj, allocation: Obj = allocation, reserved: Obj = reserved) -> None:
                status = obj.setdefault("status", {})
                status["allocation"] = allocation
                status["reservedFor"] = [reserved]

            with unless_gone():
                self._registry.mutate(
                    kinds.RESOURCECLAIMS, namespace, name, allocated, subresource="status",
                    validate=False,
                )  # fmt: skip
        if statuses:

            def recorded(obj: Obj) -> None:
                obj.setdefault("status", {})["resourceClaimStatuses"] = statuses

            with unless_gone():
                self._registry.mutate(
                    kinds.PODS, namespace, pod["metadata"]["name"], recorded,
                    subresource="status", validate=False,
                )  # fmt: skip

    def _template_spec(self, pod: Obj, entry: Obj) -> Obj | None:
        name = entry.get("resourceClaimTemplateName")
        if not name:
            return None
        namespace = pod["metadata"].get("namespace", "")
        found = self._registry.store.get(
            dra_kinds.RESOURCECLAIMTEMPLATES.group_resource, namespace, name
        )
        return None if found is None else (found.get("spec") or {}).get("spec") or {}

    def _made(self, pod: Obj, entry: Obj) -> Obj:
        namespace = pod["metadata"].get("namespace", "")
        spec = self._template_spec(pod, entry) or {}
        owner = {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
                 "uid": pod["metadata"].get("uid", ""), "controller": True}  # fmt: skip
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": _generated(pod, entry), "namespace": namespace,
                         "ownerReferences": [owner]},
            "spec": spec,
        }  # fmt: skip
        return self._registry.create(kinds.RESOURCECLAIMS, namespace, body)


def _generated(pod: Obj, entry: Obj) -> str:
    return f"{pod['metadata']['name']}-{entry['name']}"[:253]


def _results(claim: Obj) -> list[Obj]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or [])


_UUID_SELECTOR = re.compile(
    r"^device\.attributes\['gpu\.nvidia\.com'\]\.uuid in \[((?:'[A-Za-z0-9-]+'(?:, )?)+)\]$"
)


def _uuids_selected(selectors: list[Obj]) -> frozenset[str] | None:
    """The UUIDs the request's selectors name (empty: none selected, every device goes);
    None when a selector is not one the simulation reads."""
    found: set[str] = set()
    for selector in selectors:
        match = _UUID_SELECTOR.match(((selector.get("cel") or {}).get("expression") or "").strip())
        if match is None:
            return None
        found.update(re.findall(r"'([^']+)'", match.group(1)))
    return frozenset(found)


def _tolerated(tolerations: list[Obj]) -> frozenset[str]:
    """The taint keys the request tolerates (`Exists` on a key, any effect that keeps new
    claims off)."""
    return frozenset(
        str(t["key"])
        for t in tolerations
        if t.get("operator") == "Exists" and t.get("key")
        and t.get("effect") in (None, "", *_TAINTING)
    )  # fmt: skip


def _attribute(device: Obj, name: str) -> str | None:
    value = ((device.get("attributes") or {}).get(name) or {}).get("string")
    return str(value) if value is not None else None


def _selects(selector: Obj, device: Device) -> bool:
    """Whether a DeviceTaintRule's selector (any of driver, pool, device) names `device`."""
    named = zip(("driver", "pool", "device"), device, strict=True)
    return any(selector.get(k) for k, _ in named) and all(
        not selector.get(k) or selector[k] == v
        for k, v in zip(("driver", "pool", "device"), device, strict=True)
    )


def _type(device: Obj) -> str | None:
    attribute = (device.get("attributes") or {}).get("type") or {}
    return attribute.get("string")
