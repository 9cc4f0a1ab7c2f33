"""The device plugin's configuration: the `--config` file (`GPUOP_CONFIG`), YAML or JSON.

Keys are spelled as in NVIDIA's device plugin config (`version: v1`, `flags`, `sharing`)
and the Mellanox RDMA shared device plugin's `configList`, so an operator's existing
settings carry over; every key is optional:

    version: v1
    flags:
      migStrategy: none                # none | single | mixed
      plugin:
        deviceListStrategy: [envvar]   # envvar and/or cdi (also "envvar,cdi")
        passDeviceSpecs: false         # also hand out /dev/nvidia* device nodes
    sharing:
      timeSlicing:
        renameByDefault: false         # advertise nvidia.com/gpu.shared instead
        failRequestsGreaterThanOne: false
        resources:
          - name: nvidia.com/gpu       # or a mixed-strategy nvidia.com/mig-<profile>
            replicas: 4
    health:
      ignoredXids: [13, 31, 43, 45, 68, 109]
    rdma:
      configList:
        - resourceName: roce_shared    # advertised as rdma/roce_shared
          rdmaHcaMax: 64
          selectors: {vendors: ["15b3"], drivers: ["mlx5_core"], linkTypes: ["ether"]}

Read once at start by `main`; a wrong key or value stops the service with a `SettingsError`
that names the file and the key (`sharing.timeSlicing.resources.0.replicas: ...`).
"""

from __future__ import annotations

import enum
import re
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from gpuop.health import APPLICATION_XIDS
from gpuop.runtime.settings import load_config_file

GPU_RESOURCE = "nvidia.com/gpu"
"""The resource every physical GPU (or, under the single strategy, MIG device) is."""
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
"""Mixed-strategy MIG resources: `nvidia.com/mig-1g.18gb`."""
DEFAULT_IGNORED_XIDS = APPLICATION_XIDS
"""XIDs that are application errors: the GPU stays healthy (upstream's list)."""

_RESOURCE_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_PCI_ID = re.compile(r"^[0-9a-fA-F]{4}$")


class MigStrategy(enum.StrEnum):
    """How MIG devices are advertised."""

    NONE = "none"
    """Whole GPUs only, as `nvidia.com/gpu`; MIG mode is ignored."""
    SINGLE = "single"
    """MIG devices as `nvidia.com/gpu`; every GPU must be carved into one profile."""
    MIXED = "mixed"
    """MIG devices as `nvidia.com/mig-<profile>`, GPUs without MIG as `nvidia.com/gpu`."""


class DeviceListStrategy(enum.StrEnum):
    """How Allocate tells the container runtime which GPUs to give a container."""

    ENVVAR = "envvar"
    """`NVIDIA_VISIBLE_DEVICES=<uuid>,...`, read by the NVIDIA container runtime."""
    CDI = "cdi"
    """CDI device names (`k8s.device-plugin.nvidia.com/gpu=<uuid>`), resolved by the
    runtime from the spec the plugin writes under `/var/run/cdi`."""


class _Section(BaseModel):
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        use_attribute_docstrings=True,
    )


def _comma_list(value: object) -> object:
    """`"envvar,cdi"` (upstream's env var form) as a list."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class PluginFlags(_Section):
    """`flags.plugin`."""

    device_list_strategy: Annotated[
        tuple[DeviceListStrategy, ...], BeforeValidator(_comma_list), Field(min_length=1)
    ] = (DeviceListStrategy.ENVVAR,)
    """How Allocate names the GPUs: `envvar`, `cdi`, or both."""
    pass_device_specs: bool = False
    """Also answer with the `/dev/nvidia*` device nodes of the allocated GPUs."""

    @field_validator("device_list_strategy")
    @classmethod
    def _distinct(cls, value: tuple[DeviceListStrategy, ...]) -> tuple[DeviceListStrategy, ...]:
        return tuple(dict.fromkeys(value))


class Flags(_Section):
    """`flags`."""

    mig_strategy: MigStrategy = MigStrategy.NONE
    """How MIG devices are advertised."""
    plugin: PluginFlags = PluginFlags()
    """Allocate's answer."""


class ReplicatedResource(_Section):
    """One entry of `sharing.timeSlicing.resources`."""

    name: str
    """`nvidia.com/gpu`, or a mixed-strategy `nvidia.com/mig-<profile>`."""
    replicas: int = Field(ge=1, le=1024)
    """How many containers may share each device."""

    @field_validator("name")
    @classmethod
    def _gpu_resource(cls, name: str) -> str:
        if name != GPU_RESOURCE and not name.startswith(MIG_RESOURCE_PREFIX):
            raise ValueError(f"expected {GPU_RESOURCE} or {MIG_RESOURCE_PREFIX}<profile>")
        return name


class TimeSlicing(_Section):
    """`sharing.timeSlicing`."""

    rename_by_default: bool = False
    """Advertise `<name>.shared` instead of `<name>` for every replicated resource."""
    fail_requests_greater_than_one: bool = False
    """Refuse a container that asks for more than one replica."""
    resources: tuple[ReplicatedResource, ...] = ()
    """The resources to replicate."""

    @field_validator("resources")
    @classmethod
    def _distinct(cls, value: tuple[ReplicatedResource, ...]) -> tuple[ReplicatedResource, ...]:
        names = [resource.name for resource in value]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)} listed more than once")
        return value

    def replicas(self, resource: str) -> int:
        """Replicas of `resource` (1: not shared)."""
        return next((r.replicas for r in self.resources if r.name == resource), 1)


class Sharing(_Section):
    """`sharing`."""

    time_slicing: TimeSlicing = TimeSlicing()
    """Time-slicing: several containers take turns on one GPU."""


class Health(_Section):
    """`health`."""

    ignored_xids: tuple[Annotated[int, Field(ge=0, le=65535)], ...] = DEFAULT_IGNORED_XIDS
    """XIDs that leave a GPU healthy (application errors)."""


def _pci_ids(values: tuple[str, ...]) -> tuple[str, ...]:
    wrong = [v for v in values if not _PCI_ID.match(v)]
    if wrong:
        raise ValueError(f"not a 4-digit hex PCI id: {', '.join(wrong)}")
    return tuple(v.lower() for v in values)


class Selectors(_Section):
    """Which of the host's RDMA devices a resource shares. Values within one selector are
    ORed, different selectors ANDed, an absent selector ignored."""

    vendors: tuple[str, ...] = ()
    """PCI vendor ids, `15b3`."""
    device_ids: tuple[str, ...] = Field(default=(), alias="deviceIDs")
    """PCI device ids, `1017`."""
    drivers: tuple[str, ...] = ()
    """Kernel drivers, `mlx5_core`."""
    if_names: tuple[str, ...] = ()
    """Network interface names."""
    link_types: tuple[Literal["ether", "infiniband"], ...] = ()
    """Link layers."""

    _vendor_ids = field_validator("vendors", "device_ids")(_pci_ids)

    def any(self) -> bool:
        """Whether any selector is given."""
        return any((self.vendors, self.device_ids, self.drivers, self.if_names, self.link_types))


class RdmaResourceConfig(_Section):
    """One entry of `rdma.configList`: a shared RDMA resource."""

    resource_name: str
    """The name after the prefix: `roce_shared` is advertised as `rdma/roce_shared`."""
    resource_prefix: str = "rdma"
    """The resource's domain."""
    rdma_hca_max: int = Field(ge=1, le=10000)
    """How many containers may share the selected HCAs (device ids `0` to `max-1`)."""
    devices: tuple[str, ...] = ()
    """Network interface names; the same as `selectors.ifNames`."""
    selectors: Selectors = Selectors()
    """Which RDMA devices to share."""

    @field_validator("resource_name", "resource_prefix")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _RESOURCE_NAME.match(value) or len(value) > 63:
            raise ValueError("expected letters, digits, '-', '_' or '.', at most 63")
        return value

    @model_validator(mode="after")
    def _something_selected(self) -> Self:
        if not self.effective_selectors().any():
            raise ValueError("give devices or selectors: an empty selection shares nothing")
        return self

    @property
    def name(self) -> str:
        return f"{self.resource_prefix}/{self.resource_name}"

    def effective_selectors(self) -> Selectors:
        """The selectors with `devices` folded into `ifNames`."""
        names = tuple(dict.fromkeys((*self.selectors.if_names, *self.devices)))
        return self.selectors.model_copy(update={"if_names": names})


class Rdma(_Section):
    """`rdma`."""

    config_list: tuple[RdmaResourceConfig, ...] = ()
    """The shared RDMA resources."""

    @field_validator("config_list")
    @classmethod
    def _valid(cls, value: tuple[RdmaResourceConfig, ...]) -> tuple[RdmaResourceConfig, ...]:
        names = [entry.name for entry in value]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)} listed more than once")
        return value


class DevicePluginConfig(_Section):
    """The device plugin service's configuration file."""

    version: Literal["v1"] = "v1"
    """Config format version, as upstream's."""
    flags: Flags = Flags()
    """MIG strategy and Allocate's answer."""
    sharing: Sharing = Sharing()
    """GPU sharing."""
    health: Health = Health()
    """Which device events make a GPU unhealthy."""
    rdma: Rdma = Rdma()
    """RDMA shared devices."""


def load_config(path: Path | None) -> DevicePluginConfig:
    """The configuration in `path` (YAML or JSON); the defaults when `path` is None.
    Raises `SettingsError` naming the file and the first wrong key."""
    return load_config_file(path, DevicePluginConfig)
