"""`network.rdmaSharedDevices`: the RDMA resources the device plugin advertises.

Each entry is one extended resource, `<resourcePrefix>/<resourceName>`, with `rdmaHcaMax`
interchangeable ids; every pod given one gets the RDMA character devices of all the HCAs
the selectors pick. The fields and the selector
rules are the Mellanox RDMA shared device plugin's `configList`, so an upstream
configuration carries over: values inside one selector are ORed, different selectors are
ANDed, an empty selector is ignored. `NicSelectors` is shared with the secondary networks'
`master`, which picks a NIC the same way.

Network-manager's cluster role publishes this section with the rest of `network` in the
`gpuop_config` KV bucket; the device plugin reads it there.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from gpuop.policy.fields import Section, matching

HEX_ID_PATTERN = r"^[0-9a-fA-F]{4}$"
DRIVER_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
INTERFACE_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}$"
"""A Linux interface name: at most 15 characters (IFNAMSIZ - 1), no `/`, `:` or space."""
RESOURCE_NAME_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
RESOURCE_PREFIX_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

HexId = Annotated[
    str,
    Field(json_schema_extra={"pattern": HEX_ID_PATTERN}),
    matching(HEX_ID_PATTERN, 'must be four hex digits without "0x", such as "15b3"'),
]
"""A 16-bit PCI id as four hex digits without `0x`: `15b3`, `101e`."""
DriverName = Annotated[
    str,
    Field(json_schema_extra={"pattern": DRIVER_PATTERN}),
    matching(DRIVER_PATTERN, 'must be a kernel driver name, such as "mlx5_core"'),
]
"""A kernel driver bound to a NIC's PCI function: `mlx5_core`."""
InterfaceName = Annotated[
    str,
    Field(json_schema_extra={"pattern": INTERFACE_PATTERN}),
    matching(
        INTERFACE_PATTERN,
        "must be a network interface name: 1 to 15 letters, digits and _ . -, "
        "not starting with . or -",
    ),
]
"""A Linux network interface name: `enp65s0f0np0`."""
LinkType = Annotated[
    str,
    Field(json_schema_extra={"pattern": "^(ether|infiniband)$"}),
    matching("^(ether|infiniband)$", 'must be "ether" or "infiniband"'),
]
"""A link layer as the RDMA shared device plugin names it."""


class NicSelectors(Section):
    """Which NICs qualify: a NIC must match every selector that is set, and one value of
    each. All empty: no NIC is selected by these."""

    vendors: list[HexId] = Field(default=[], max_length=16)
    """PCI vendor ids, `15b3` for Mellanox (NVIDIA networking)."""
    device_ids: list[HexId] = Field(default=[], alias="deviceIDs", max_length=64)
    """PCI device ids: `101e` (ConnectX-7), `1021` (ConnectX-7 VF), ..."""
    drivers: list[DriverName] = Field(default=[], max_length=16)
    """Kernel drivers bound to the NIC's PCI function: `mlx5_core`."""

    @property
    def empty(self) -> bool:
        return not (self.vendors or self.device_ids or self.drivers)

    def matches(self, vendor: str | None, device: str | None, driver: str | None) -> bool:
        """Whether a NIC with these PCI ids (hex, any case) and driver is selected."""
        if self.empty:
            return False
        return (
            _matches(self.vendors, vendor)
            and _matches(self.device_ids, device)
            and (not self.drivers or driver in self.drivers)
        )


def _matches(wanted: list[str], value: str | None) -> bool:
    if not wanted:
        return True
    return value is not None and value.lower() in {item.lower() for item in wanted}


class RdmaSelectors(NicSelectors):
    """Which HCAs one RDMA resource shares, as the RDMA shared device plugin selects them."""

    if_names: list[InterfaceName] = Field(default=[], max_length=64)
    """Network interfaces of the HCAs: `enp65s0f0np0`."""
    link_types: list[LinkType] = Field(default=[], max_length=2)
    """Link layers: `ether` (RoCE) or `infiniband`."""

    @property
    def empty(self) -> bool:
        return super().empty and not (self.if_names or self.link_types)


class RdmaSharedDevice(Section):
    """One RDMA resource the device plugin advertises on every node with a matching HCA."""

    resource_name: Annotated[
        str,
        Field(json_schema_extra={"pattern": RESOURCE_NAME_PATTERN}),
        matching(RESOURCE_NAME_PATTERN, 'must be a resource name such as "roce_shared"'),
    ]
    """The resource's name: pods ask for `<resourcePrefix>/<resourceName>`, e.g.
    `rdma/roce_shared: 1`."""
    resource_prefix: Annotated[
        str,
        Field(max_length=253, json_schema_extra={"pattern": RESOURCE_PREFIX_PATTERN}),
        matching(RESOURCE_PREFIX_PATTERN, 'must be a DNS subdomain such as "rdma"'),
    ] = "rdma"
    """The resource's prefix."""
    rdma_hca_max: int = Field(default=64, ge=1, le=10_000)
    """How many pods on a node may hold the resource at once (the ids advertised); they all
    share the selected HCAs."""
    selectors: RdmaSelectors
    """The HCAs shared; at least one selector must be set."""

    @model_validator(mode="after")
    def _selects_something(self) -> RdmaSharedDevice:
        if self.selectors.empty:
            raise PydanticCustomError(
                "rdma_selectors",
                "set at least one of vendors, deviceIDs, drivers, ifNames or linkTypes",
                {"field": "selectors"},
            )
        return self

    @property
    def full_name(self) -> str:
        """The extended resource's name: `rdma/roce_shared`."""
        return f"{self.resource_prefix}/{self.resource_name}"
