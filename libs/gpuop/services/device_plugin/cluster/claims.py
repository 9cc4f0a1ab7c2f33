"""ResourceClaims' allocations, told to the nodes whose GPUs they hold; called by the role.

`ClaimPublisher.observe(claim)` takes each version of a claim the watch reports and decides
what each node must hear: `dra.ClaimAllocated` for every node with a device of the claim's
allocation (again whenever what it says changes: the pods in `reservedFor`, the configs),
`dra.ClaimReleased` for a node that heard of the claim and no longer holds a device of it
(the claim deallocated, or deleted: `forget`). A result's device is matched to a node's GPU
by its pool and name for gpuop's own driver (`gpu-<minor>`, MIG names: `dra_devices`), and,
for any other driver, through the device its slice lists: its `uuid` attribute (a GPU or MIG
UUID) or its `resource.kubernetes.io/pciBusID`, looked up among the GPUs of the slice's node.
Another driver's device on a node gpuop has no inventory of, or that no slice lists, is told
to nobody.

What was told is the state: `restore` folds the log's `dra` events (latest per claim and
node), so after a restart a claim deleted meanwhile is released, and one unchanged is not
told again. Opaque configurations for gpuop's driver pass through as the API server holds
them (the node's plugin decodes them and refuses what it cannot apply).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gpuop.events import dra
from gpuop.events.hardware import HardwareDiscovered
from gpuop.inventory import dra_devices
from gpuop.kube import dra as kube_dra

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Told = dict[tuple[str, str], "dra.ClaimAllocated"]
"""(claim uid, node) -> the allocation last told to that node."""


@dataclass(frozen=True)
class Tell:
    """One event to publish on one node."""

    node: str
    event: dra.ClaimAllocated | dra.ClaimReleased


def claim_ref(claim: Mapping[str, Any]) -> dra.ClaimRef:
    metadata = claim.get("metadata") or {}
    return dra.ClaimRef(
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""),
    )


def reserving_pods(claim: Mapping[str, Any]) -> tuple[dra.PodRef, ...]:
    """The pods in `status.reservedFor` (other consumers, such as workloads, are left out)."""
    namespace = str((claim.get("metadata") or {}).get("namespace") or "")
    return tuple(
        dra.PodRef(namespace=namespace, name=str(entry["name"]), uid=str(entry["uid"]))
        for entry in (claim.get("status") or {}).get("reservedFor") or []
        if entry.get("resource") == "pods" and not entry.get("apiGroup")
    )


def opaque_configs(claim: Mapping[str, Any]) -> tuple[dra.OpaqueConfig, ...]:
    """The allocation's opaque configurations for gpuop's driver, in the API server's order."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    found: list[dra.OpaqueConfig] = []
    for entry in (allocation.get("devices") or {}).get("config") or []:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != dra.DRIVER:
            continue
        parameters = opaque.get("parameters")
        if not isinstance(parameters, dict):
            log.warning(
                "claim %s: opaque parameters that are no object, left out", claim_ref(claim)
            )
            continue
        source = (
            dra.ConfigSource.CLASS if entry.get("source") == "FromClass" else dra.ConfigSource.CLAIM
        )
        found.append(
            dra.OpaqueConfig(
                source=source, requests=tuple(entry.get("requests") or ()), parameters=parameters
            )
        )
    return tuple(found)


class DeviceIndex:
    """Which node's GPU a device of an allocation result is."""

    def __init__(
        self,
        inventories: Callable[[], Mapping[str, HardwareDiscovered]],
        slices: Callable[[], Iterable[Mapping[str, Any]]],
    ) -> None:
        self._inventories = inventories
        self._slices = slices

    def locate(self, result: Mapping[str, Any]) -> tuple[str, dra.AllocatedDevice] | None:
        """The node and the device of one allocation result; None when it is on no node
        gpuop knows."""
        driver, pool, name = (str(result.get(k) or "") for k in ("driver", "pool", "device"))
        inventories = self._inventories()
        if driver == dra.DRIVER:
            # gpuop's pools are named after their nodes; a node whose inventory is not known
            # (yet) still hears of its claim, without the GPU named
            known = inventories.get(pool)
            own = {d.name: d for d in dra_devices.devices_of(known)} if known else {}
            device = own.get(name)
            gpu_uuid, mig_uuid = (device.gpu_uuid, device.mig_uuid) if device else (None, None)
            return pool, self._allocated(result, gpu_uuid, mig_uuid)
        listed = self._listed(driver, pool, name)
        if listed is None:
            return None
        node, attributes = listed
        inventory = inventories.get(node)
        if inventory is None:
            return None
        gpu_uuid, mig_uuid = _match(attributes, inventory)
        return node, self._allocated(result, gpu_uuid, mig_uuid)

    def _listed(self, driver: str, pool: str, name: str) -> tuple[str, Obj] | None:
        """The node and attributes of a device some slice lists."""
        for slice_ in self._slices():
            spec = slice_.get("spec") or {}
            if spec.get("driver") != driver or (spec.get("pool") or {}).get("name") != pool:
                continue
            node = spec.get("nodeName")
            for device in spec.get("devices") or []:
                if device.get("name") == name and node:
                    return str(node), dict(device.get("attributes") or {})
        return None

    @staticmethod
    def _allocated(
        result: Mapping[str, Any], gpu_uuid: str | None, mig_uuid: str | None
    ) -> dra.AllocatedDevice:
        return dra.AllocatedDevice(
            request=str(result.get("request") or ""),
            driver=str(result.get("driver") or ""),
            pool=str(result.get("pool") or ""),
            device=str(result.get("device") or ""),
            gpu_uuid=gpu_uuid,
            mig_uuid=mig_uuid,
            admin_access=bool(result.get("adminAccess")),
        )


def _attribute(attributes: Mapping[str, Any], *names: str) -> str | None:
    for name in names:
        value = (attributes.get(name) or {}).get("string")
        if value:
            return str(value)
    return None


def _pci_address(address: str) -> str:
    """A PCI address with a 4-digit domain, lowercase: NVML writes 8 (`00000000:00:06.0`)."""
    text = address.strip().lower()
    domain, colon, rest = text.partition(":")
    if not colon or rest.count(":") != 1:
        return text
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return text


def _match(
    attributes: Mapping[str, Any], inventory: HardwareDiscovered
) -> tuple[str | None, str | None]:
    """The GPU (and MIG device) of the node a foreign device's attributes name."""
    uuid = _attribute(attributes, "uuid")
    bus_id = _attribute(attributes, dra_devices.PCI_BUS_ID)
    for gpu in inventory.gpus:
        if uuid == gpu.uuid:
            return gpu.uuid, None
        for mig in gpu.mig_devices:
            if uuid == mig.uuid:
                return gpu.uuid, mig.uuid
        if bus_id is not None and _pci_address(bus_id) == _pci_address(gpu.pci_bus_id):
            return gpu.uuid, None
    return None, None


class ClaimPublisher:
    """Decides what each node hears of each claim; the role publishes what it returns and
    then calls `told`."""

    def __init__(self, index: DeviceIndex) -> None:
        self._index = index
        self._told: Told = {}

    @property
    def claims(self) -> frozenset[str]:
        """Uids of the claims some node was last told are allocated."""
        return frozenset(uid for uid, _ in self._told)

    def restore(self, events: Iterable[tuple[str, dra.ClaimAllocated | dra.ClaimReleased]]) -> None:
        """Fold the log's `dra` events, oldest first, into what each node was last told."""
        for node, event in events:
            key = (event.claim.uid, node)
            if isinstance(event, dra.ClaimAllocated):
                self._told[key] = event
            else:
                self._told.pop(key, None)

    def observe(self, claim: Mapping[str, Any]) -> list[Tell]:
        """What to tell the nodes about this version of `claim`."""
        try:
            ref = claim_ref(claim)
        except ValidationError as error:
            log.warning("a claim without a usable name or uid: %s", error)
            return []
        by_node: dict[str, list[dra.AllocatedDevice]] = {}
        for result in kube_dra.allocation_results(claim):
            try:
                located = self._index.locate(result)
            except ValidationError as error:
                log.warning("claim %s: a result gpuop cannot name: %s", ref, error)
                continue
            if located is not None:
                by_node.setdefault(located[0], []).append(located[1])
        version = str((claim.get("metadata") or {}).get("resourceVersion") or "0")
        tells: list[Tell] = []
        for node, devices in sorted(by_node.items()):
            event = dra.ClaimAllocated(
                claim=ref,
                devices=tuple(devices),
                configs=opaque_configs(claim),
                pods=reserving_pods(claim),
                resource_version=version,
            )
            if not _same(self._told.get((ref.uid, node)), event):
                tells.append(Tell(node, event))
        for uid, node in sorted(self._told):
            if uid == ref.uid and node not in by_node:
                tells.append(Tell(node, dra.ClaimReleased(claim=ref, deleted=False)))
        return tells

    def forget(self, claim: Mapping[str, Any] | dra.ClaimRef) -> list[Tell]:
        """The claim is gone: release it on every node that holds it."""
        ref = claim if isinstance(claim, dra.ClaimRef) else claim_ref(claim)
        return [
            Tell(node, dra.ClaimReleased(claim=ref, deleted=True))
            for uid, node in sorted(self._told)
            if uid == ref.uid
        ]

    def gone_since(self, present: Iterable[str]) -> list[Tell]:
        """Release every claim told allocated whose uid is not among `present` (the claims
        listed at start): deleted while this role was not watching."""
        alive = set(present)
        tells: list[Tell] = []
        for (uid, node), told in sorted(self._told.items()):
            if uid not in alive:
                tells.append(Tell(node, dra.ClaimReleased(claim=told.claim, deleted=True)))
        return tells

    def told(self, tell: Tell) -> None:
        """`tell` was published: remember it."""
        key = (tell.event.claim.uid, tell.node)
        if isinstance(tell.event, dra.ClaimAllocated):
            self._told[key] = tell.event
        else:
            self._told.pop(key, None)


def _same(told: dra.ClaimAllocated | None, event: dra.ClaimAllocated) -> bool:
    """Whether a node was told this already (the resourceVersion aside)."""
    if told is None:
        return False
    return told.model_copy(update={"resource_version": event.resource_version}) == event
