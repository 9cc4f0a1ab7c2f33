"""The device plugin's configuration: the `--config` file (`GPUOP_CONFIG`), YAML or JSON.

Keys are spelled as in NVIDIA's device plugin config (`version: v1`, `flags`, `sharing`)
and the Mellanox RDMA shared device plugin's `configList`, so an operator's existing
settings carry over; every key is optional:

    version: v1
    flags:
      migStrategy: none                # none | single | mixed
      plugin:
        deviceListStrategy: [envvar]   # envvar and/or cdi (also "envvar,cdi"); unset: cdi
                                       # where the node has the driver's CDI spec
        passDeviceSpecs: false         # also hand out /dev/nvidia* device nodes
      mpsRoot: /run/nvidia/mps         # the host directory of the MPS daemons' pipes
      kubeletRootDir: /var/lib/kubelet # the kubelet's --root-dir (DRA and PodResources sockets)
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

Instead of `timeSlicing`, `sharing.mps` shares each GPU with CUDA MPS, as upstream's
`sharing.mps` (the two are exclusive):

    sharing:
      mps:
        renameByDefault: false
        resources:
          - name: nvidia.com/gpu       # whole GPUs only: MPS does not share MIG devices
            replicas: 4                # 2 to 48 (an MPS server's client limit)

The GPUs are advertised as time-sliced ones are (`<uuid>::<n>`), the plugin runs one MPS
control daemon per resource (`mpscontrol`), and a container gets the daemon's pipe
directory with its share of the GPU: `100/replicas` percent of its threads and
`memory/replicas` of its memory. A request for more than one replica fails unless
`failRequestsGreaterThanOne: false` says otherwise (upstream's default for MPS); `devices`
may only be `all` (upstream ignores any other value with a warning; here it is refused).

The file may instead hold several named configs, one of which each node runs: the one its
label `nvidia.com/device-plugin.config` names (`selecting`), as upstream's per-node configs.
Each is a config as above; names are DNS labels:

    default: exclusive                 # the config of nodes without the label
    configs:
      exclusive: {}
      shared:
        sharing:
          timeSlicing:
            resources: [{name: nvidia.com/gpu, replicas: 4}]

Without `default`, a config named `default` is the default, or the only one when there is
one. A file without `configs` is a single config: it is what every node runs.

Read at start by `main` (`load_configs`); a wrong key or value stops the service with a
`SettingsError` that names the file and the key (`sharing.timeSlicing.resources.0.replicas:
...`, `configs.shared.sharing.timeSlicing...` in a named file). The plugin reads the file
again for every switch of config, so that a file changed under it (a ConfigMap mounted as a
directory, as upstream mounts it) takes effect with the next label change; a file that no
longer validates then refuses the switch. The Helm chart mounts the file with `subPath` and
rolls the pods when the config changes, so there a new file arrives with a restart.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Literal, Self

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from gpuop.health import APPLICATION_XIDS
from gpuop.runtime.settings import SettingsError, load_config_file

GPU_RESOURCE = "nvidia.com/gpu"
"""The resource every physical GPU (or, under the single strategy, MIG device) is."""
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
"""Mixed-strategy MIG resources: `nvidia.com/mig-1g.18gb`."""
MPS_MIN_REPLICAS = 2
"""MPS shares a GPU among 2 or more clients; 1 replica shares nothing."""
MPS_MAX_REPLICAS = 48
"""Clients one MPS server takes on Volta and later GPUs (upstream's limit; 16 before Volta)."""
DEFAULT_MPS_ROOT = "/run/nvidia/mps"
"""Where on the host the MPS daemons keep their pipes and logs (upstream's default)."""
DEFAULT_KUBELET_ROOT_DIR = "/var/lib/kubelet"
"""The kubelet's `--root-dir` unless the node's kubelet runs with another (its default)."""
DEFAULT_NAME = "default"
"""The name of a single config, and of the default of named ones that name none (upstream's
fallback name)."""

_RESOURCE_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_PCI_ID = re.compile(r"^[0-9a-fA-F]{4}$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


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
    """How Allocate names the GPUs: `envvar`, `cdi`, or both. Unset: `cdi` where the node
    has a complete CDI spec, else `envvar` (`resolved`)."""
    pass_device_specs: bool = False
    """Also answer with the `/dev/nvidia*` device nodes of the allocated GPUs."""

    def resolved(self, cdi_ready: bool) -> PluginFlags:
        """These flags with the device list strategy chosen where the file names none: `cdi`
        on a node with a complete CDI spec (`cdi_ready`: the driver-manager writes one with
        the driver's files, and configures the runtime's `nvidia` handler with CDI), else
        `envvar`. A strategy the file names is kept, `envvar` included."""
        if "device_list_strategy" in self.model_fields_set or not cdi_ready:
            return self
        return self.model_copy(update={"device_list_strategy": (DeviceListStrategy.CDI,)})

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
    mps_root: str = DEFAULT_MPS_ROOT
    """The host directory under which each MPS daemon gets `<resource>/pipe` and
    `<resource>/log`, and the containers their `shm`."""
    kubelet_root_dir: str = DEFAULT_KUBELET_ROOT_DIR
    """The node's kubelet `--root-dir`, as the host sees it: the DRA plugin's registration
    socket goes into its `plugins_registry`, its DRA socket and checkpoint into
    `plugins/gpu.nvidia.com`, and the PodResources socket is read from its `pod-resources`
    (all under the host root). The device plugin API's directory is
    `/var/lib/kubelet/device-plugins` whatever it says, as the kubelet's is. The node's, so
    the same in every named config."""

    @field_validator("mps_root", "kubelet_root_dir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or ".." in value.split("/"):
            raise ValueError("expected an absolute host path without '..'")
        return value.rstrip("/") or "/"


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


def _check_listed_once(names: Sequence[str]) -> None:
    """Refuse shared resources (time-slicing's or MPS's) that name one more than once."""
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} listed more than once")


def _replicas_of(resources: Sequence[ReplicatedResource | MpsResource], name: str) -> int:
    """Replicas of the resource called `name` among `resources` (1: not shared)."""
    return next((r.replicas for r in resources if r.name == name), 1)


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
        _check_listed_once([resource.name for resource in value])
        return value

    def replicas(self, resource: str) -> int:
        """Replicas of `resource` (1: not shared)."""
        return _replicas_of(self.resources, resource)


class MpsResource(_Section):
    """One entry of `sharing.mps.resources`."""

    name: str
    """`nvidia.com/gpu`: whole GPUs (MPS does not share MIG devices)."""
    replicas: int
    """How many containers share each GPU, each with its part of the threads and memory."""
    devices: str | int | tuple[str | int, ...] = "all"
    """Which GPUs are shared: only `all`."""

    @field_validator("name")
    @classmethod
    def _whole_gpus(cls, name: str) -> str:
        if name.startswith(MIG_RESOURCE_PREFIX):
            raise ValueError(
                f"{name}: MPS does not share MIG devices (NVIDIA's device plugin refuses them"
                " too); share MIG devices with sharing.timeSlicing"
            )
        if name != GPU_RESOURCE:
            raise ValueError(f"expected {GPU_RESOURCE}")
        return name

    @field_validator("replicas")
    @classmethod
    def _clients(cls, replicas: int) -> int:
        if replicas < MPS_MIN_REPLICAS:
            raise ValueError(
                f"MPS needs at least {MPS_MIN_REPLICAS} replicas ({replicas} shares nothing)"
            )
        if replicas > MPS_MAX_REPLICAS:
            raise ValueError(
                f"an MPS server takes at most {MPS_MAX_REPLICAS} clients, not {replicas}"
            )
        return replicas

    @field_validator("devices")
    @classmethod
    def _all(cls, devices: object) -> str:
        if devices != "all":
            raise ValueError(
                f"only 'all' is supported, not {devices!r} (NVIDIA's device plugin ignores"
                " any other value)"
            )
        return "all"


class Mps(_Section):
    """`sharing.mps`."""

    rename_by_default: bool = False
    """Advertise `<name>.shared` instead of `<name>` for every shared resource."""
    fail_requests_greater_than_one: bool | None = None
    """Refuse a container that asks for more than one replica; unset means yes, upstream's
    default for MPS (a container is one MPS client)."""
    resources: tuple[MpsResource, ...] = ()
    """The resources to share."""

    @field_validator("resources")
    @classmethod
    def _distinct(cls, value: tuple[MpsResource, ...]) -> tuple[MpsResource, ...]:
        _check_listed_once([resource.name for resource in value])
        return value

    def replicas(self, resource: str) -> int:
        """Replicas of `resource` (1: not shared)."""
        return _replicas_of(self.resources, resource)


class Sharing(_Section):
    """`sharing`: `timeSlicing` or `mps`, not both."""

    time_slicing: TimeSlicing = TimeSlicing()
    """Time-slicing: several containers take turns on one GPU."""
    mps: Mps | None = None
    """CUDA MPS: several containers run on one GPU at once, each with its share of it."""

    @model_validator(mode="after")
    def _one_strategy(self) -> Self:
        if self.mps is not None and "time_slicing" in self.model_fields_set:
            raise ValueError(
                "sharing.timeSlicing and sharing.mps are exclusive: give one of them"
                " (a GPU is either time-sliced or shared with MPS)"
            )
        return self

    @property
    def uses_mps(self) -> bool:
        """Whether some resource is shared with MPS."""
        return self.mps is not None and any(r.replicas > 1 for r in self.mps.resources)

    def replicas(self, resource: str) -> int:
        """Replicas of `resource` under the strategy in force (1: not shared)."""
        if self.mps is not None:
            return self.mps.replicas(resource)
        return self.time_slicing.replicas(resource)

    @property
    def rename_by_default(self) -> bool:
        """Whether shared resources are advertised as `<name>.shared`."""
        if self.mps is not None:
            return self.mps.rename_by_default
        return self.time_slicing.rename_by_default

    @property
    def fail_requests_greater_than_one(self) -> bool:
        """Whether a request for more than one replica fails (for MPS unless said not to)."""
        if self.mps is not None:
            return self.mps.fail_requests_greater_than_one is not False
        return self.time_slicing.fail_requests_greater_than_one


class Health(_Section):
    """`health`."""

    ignored_xids: tuple[Annotated[int, Field(ge=0, le=65535)], ...] = APPLICATION_XIDS
    """XIDs that leave a GPU healthy (`gpuop.health.ignores`); by default the application
    errors (`gpuop.health.APPLICATION_XIDS`, upstream's list), as telemetry's."""


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

    @model_validator(mode="after")
    def _mps_on_whole_gpus(self) -> Self:
        if self.sharing.uses_mps and self.flags.mig_strategy is MigStrategy.SINGLE:
            raise ValueError(
                "sharing.mps with flags.migStrategy single: nvidia.com/gpu is MIG devices"
                " then, and MPS does not share MIG devices"
            )
        return self


def _config_name(name: str) -> str:
    if not _DNS_LABEL.match(name):
        raise ValueError(
            f"{name!r} is not a DNS label: lowercase letters, digits and '-', at most 63"
        )
    return name


ConfigName = Annotated[str, AfterValidator(_config_name)]
"""The name of one of several configs: what a node's label names."""


class NamedConfigs(_Section):
    """A `--config` file of several named configs."""

    configs: dict[ConfigName, DevicePluginConfig] = Field(min_length=1)
    """The configs, by name."""
    default: ConfigName | None = Field(default=None, validate_default=True)
    """The config of a node without the label (or with a label naming no config)."""

    @field_validator("default")
    @classmethod
    def _one_of_the_configs(cls, default: str | None, info: ValidationInfo) -> str | None:
        configs: dict[str, DevicePluginConfig] | None = info.data.get("configs")
        if configs is None:  # wrong itself: that error is the one to tell
            return default
        names = ", ".join(sorted(configs))
        if default is None:
            if DEFAULT_NAME in configs or len(configs) == 1:
                return default
            raise ValueError(f"name the default config: one of {names}")
        if default not in configs:
            raise ValueError(f"{default!r} is not one of the configs ({names})")
        return default

    @model_validator(mode="after")
    def _one_kubelet(self) -> Self:
        roots = {config.flags.kubelet_root_dir for config in self.configs.values()}
        if len(roots) > 1:
            raise ValueError(
                "flags.kubeletRootDir is the node's kubelet's, the same in every config,"
                f" not {', '.join(sorted(roots))}"
            )
        return self

    @property
    def default_name(self) -> str:
        if self.default is not None:
            return self.default
        return DEFAULT_NAME if DEFAULT_NAME in self.configs else next(iter(self.configs))


@dataclass(frozen=True)
class PluginConfigs:
    """What the `--config` file holds, in either form: the configs by name and the default.
    A single config is named `DEFAULT_NAME`."""

    configs: Mapping[str, DevicePluginConfig]
    default: str
    named: bool = False
    """The file holds named configs (rather than a single one)."""

    def __post_init__(self) -> None:
        if self.default not in self.configs:
            raise ValueError(f"the default {self.default!r} is not one of the configs")
        object.__setattr__(self, "configs", MappingProxyType(dict(self.configs)))

    @classmethod
    def single(cls, config: DevicePluginConfig) -> PluginConfigs:
        """A file holding one config."""
        return cls({DEFAULT_NAME: config}, DEFAULT_NAME)

    @classmethod
    def of(cls, named: NamedConfigs) -> PluginConfigs:
        return cls(named.configs, named.default_name, named=True)

    @property
    def default_config(self) -> DevicePluginConfig:
        return self.configs[self.default]

    @property
    def kubelet_root_dir(self) -> str:
        """The kubelet's `--root-dir` on the host, relative to the host root
        (`var/lib/kubelet`): every config names the same."""
        return self.default_config.flags.kubelet_root_dir.lstrip("/")


def load_config(path: Path | None) -> DevicePluginConfig:
    """The single configuration in `path` (YAML or JSON); the defaults when `path` is None.
    Raises `SettingsError` naming the file and the first wrong key."""
    return load_config_file(path, DevicePluginConfig)


def load_configs(path: Path | None) -> PluginConfigs:
    """The configuration in `path` in either form, a single config or named ones (a file
    with `configs`); the defaults when `path` is None. Raises `SettingsError` naming the
    file and the first wrong key (`configs.<name>.<key>` in a named file)."""
    if path is None:
        return PluginConfigs.single(DevicePluginConfig())
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise SettingsError(f"--config {path}: cannot read it: {error}") from None
    if not isinstance(document, dict):
        raise SettingsError(f"--config {path}: expected a mapping of settings")
    try:
        if "configs" in document:
            return PluginConfigs.of(NamedConfigs.model_validate(document))
        return PluginConfigs.single(DevicePluginConfig.model_validate(document))
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "settings"
        raise SettingsError(f"--config {path}: {where}: {first['msg']}") from None
