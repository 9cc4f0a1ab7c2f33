"""RDMA shared devices: `rdma/<resourceName>` resources, as Mellanox's shared device plugin
advertises them.

Each `rdma.configList` entry picks HCAs of the host (`hcas.hcas`) with its selectors and
advertises `rdmaHcaMax` interchangeable ids `0` .. `max-1`: every container given one gets
the character devices of all the picked HCAs (`uverbs<n>`, `umad<n>`, and `rdma_cm`) as
`rwm` device nodes. Values within one selector are ORed, selectors ANDed, an absent
selector ignored. A resource whose selectors pick nothing advertises no device; since that
is the usual way such a plugin goes wrong, the log says which selector removed each HCA.
`plugins.DevicePlugins` builds them at start and again when the OFED driver is back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuop.events.driver import Component
from gpuop.host.roots import HostRoot
from gpuop.kubelet.deviceplugin.v1beta1 import api_pb2
from gpuop.services.device_plugin import hcas
from gpuop.services.device_plugin.config import RdmaResourceConfig, Selectors
from gpuop.services.device_plugin.errors import AllocationError
from gpuop.services.device_plugin.hcas import Hca
from gpuop.services.device_plugin.resources import AdvertisedDevice

log = logging.getLogger(__name__)

PERMISSIONS = "rwm"
"""RDMA character devices are read, written and created (mknod) by the RDMA libraries."""

_SELECTORS: tuple[
    tuple[str, Callable[[Selectors], tuple[str, ...]], Callable[[Hca], tuple[str, ...]]], ...
] = (
    ("vendors", lambda s: s.vendors, lambda h: (h.vendor,) if h.vendor else ()),
    ("deviceIDs", lambda s: s.device_ids, lambda h: (h.device,) if h.device else ()),
    ("drivers", lambda s: s.drivers, lambda h: (h.driver,) if h.driver else ()),
    ("ifNames", lambda s: s.if_names, lambda h: h.interfaces),
    ("linkTypes", lambda s: s.link_types, lambda h: h.link_types),
)
"""Each selector: its name in the config, the values it wants, the values an HCA has."""


@dataclass(frozen=True)
class RdmaResource:
    """One shared RDMA resource and the HCAs it hands out."""

    name: str
    devices: tuple[AdvertisedDevice, ...]
    hcas: tuple[Hca, ...]
    component: Component = Component.OFED
    preferred_allocation_available: bool = False

    def allocate(self, device_ids: Sequence[str]) -> api_pb2.ContainerAllocateResponse:
        known = {device.id for device in self.devices}
        unknown = [device_id for device_id in device_ids if device_id not in known]
        if unknown:
            raise AllocationError(f"{self.name}: unknown device id {', '.join(map(repr, unknown))}")
        nodes = dict.fromkeys(
            [node for hca in self.hcas for node in hca.character_devices] + [hcas.RDMA_CM]
        )
        return api_pb2.ContainerAllocateResponse(
            devices=[
                api_pb2.DeviceSpec(container_path=node, host_path=node, permissions=PERMISSIONS)
                for node in nodes
            ]
        )

    def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """Any ids will do: they all share the same HCAs."""
        chosen = list(dict.fromkeys([*must_include, *available]))[:size]
        if len(chosen) < size:
            raise AllocationError(f"{self.name}: cannot choose {size} of {len(chosen)} devices")
        return chosen


def rdma_resources(
    root: HostRoot, entries: Sequence[RdmaResourceConfig]
) -> tuple[RdmaResource, ...]:
    """The configured resources over the host's HCAs. Raises `HostReadError`."""
    if not entries:
        return ()
    found = hcas.hcas(root)
    return tuple(_resource(entry, found) for entry in entries)


def select(found: Sequence[Hca], selectors: Selectors) -> tuple[list[Hca], dict[str, str]]:
    """The HCAs the selectors pick, and for each other one the selector that removed it."""
    picked: list[Hca] = []
    removed: dict[str, str] = {}
    for hca in found:
        for name, wanted, has in _SELECTORS:
            values = wanted(selectors)
            if values and not set(values) & set(has(hca)):
                removed[hca.name] = f"{name} {list(values)} (it has {list(has(hca))})"
                break
        else:
            picked.append(hca)
    return picked, removed


def _resource(entry: RdmaResourceConfig, found: Sequence[Hca]) -> RdmaResource:
    picked, removed = select(found, entry.effective_selectors())
    for hca, reason in removed.items():
        log.info("%s: HCA %s not selected by %s", entry.name, hca, reason)
    if not picked:
        log.warning(
            "%s selects none of the %d RDMA devices of the host: advertising no device",
            entry.name,
            len(found),
        )
    count = entry.rdma_hca_max if picked else 0
    devices = tuple(AdvertisedDevice(str(n), None, None) for n in range(count))
    return RdmaResource(entry.name, devices, tuple(picked))
