"""The `mig` section: the MIG layouts a node's label `nvidia.com/mig.config` may name.

Upstream's MIG manager reads mig-parted's config file (`version: v1`, `mig-configs:` config
name -> a list of device specs) from a ConfigMap, `default-mig-parted-config` with the key
`config.yaml`, and applies the config the node's label `nvidia.com/mig.config` names. gpuop
reads the same file, from one of two places:

    config      the file's text inline in the policy (what a ConfigMap's `config.yaml` holds),
                parsed when the policy is validated, so a bad file is refused with the
                policy's `Valid=False` condition before any node is touched
    configMap   the name of a ConfigMap in the orchestrator's namespace holding it under
                `config.yaml` (`configMapKey`), read by the orchestrator when a saga starts;
                a file there that does not parse fails that saga with the parser's reason

Neither set: no MIG configs, and every label value fails its saga at once with that reason.
The file is parsed by `gpuop.policy.migconfig` (the node side reads it alike), and every
problem it reports is prefixed with `configs_source`, which names where the file came from.

The MIG reconfiguration saga (`gpuop.saga.mig`) reads `deadlines` for its steps and
`eviction` for the pods it evicts from the GPUs being re-carved.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from gpuop.policy import migconfig
from gpuop.policy.fields import DeadlineSeconds, Section, matching

CONFIG_MAP_KEY = "config.yaml"
"""The key of upstream's `default-mig-parted-config` ConfigMap that holds the file."""
MAX_CONFIG_BYTES = 256 * 1024
"""The longest inline file: a ConfigMap holds at most 1 MiB, a policy shares its object."""
CONFIG_MAP_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
KEY_PATTERN = r"^[-._a-zA-Z0-9]{1,253}$"

ConfigMapName = Annotated[
    str,
    Field(json_schema_extra={"pattern": CONFIG_MAP_PATTERN}),
    matching(CONFIG_MAP_PATTERN, "must be a ConfigMap name (a DNS subdomain)"),
]
ConfigMapKey = Annotated[
    str,
    Field(json_schema_extra={"pattern": KEY_PATTERN}),
    matching(KEY_PATTERN, "must be a ConfigMap key: letters, digits, '-', '_' and '.'"),
]


class MigDeadlines(Section):
    """The longest each step of a node's MIG reconfiguration may take, in seconds."""

    operands_pause: DeadlineSeconds = 300
    """Pausing the node's operands (the device plugin advertises the GPUs Unhealthy, so no
    new pod is given one) and waiting for each to confirm."""
    holders: DeadlineSeconds = 60
    """The device plugin's answer naming the pods that hold the GPUs being re-carved."""
    eviction: DeadlineSeconds = 600
    """Evicting those pods until they are gone."""
    apply: DeadlineSeconds = 900
    """The driver-manager applying the layout (MIG mode, GPU and compute instances, the
    CDI spec) and answering."""
    reboot: DeadlineSeconds = 1800
    """The node coming back with a new boot id after a reboot for a MIG mode NVML left
    pending until one."""
    restore: DeadlineSeconds = 900
    """Putting back the layout recorded at the start, after a failure the node did not
    undo itself."""
    operands_resume: DeadlineSeconds = 300
    """Resuming the operands until each confirms (the device plugin advertises the new MIG
    devices)."""


class MigEviction(Section):
    """Evicting the pods that hold the GPUs being re-carved (only those pods)."""

    force: bool = False
    """Also evict such pods that no controller manages (they will not be recreated)."""
    delete_empty_dir: bool = False
    """Also evict such pods with emptyDir volumes (their local data is lost)."""


class MigPolicy(Section):
    """MIG layouts selected per node by the label `nvidia.com/mig.config`, in mig-parted's
    config format, and how a node is re-carved."""

    config: str | None = Field(default=None, max_length=MAX_CONFIG_BYTES)
    """mig-parted's config file inline (`version: v1`, `mig-configs: {<name>: [<device
    spec>, ...]}`), as upstream's ConfigMap holds it under `config.yaml`."""
    config_map: ConfigMapName | None = None
    """Or the name of a ConfigMap in the orchestrator's namespace holding the file."""
    config_map_key: ConfigMapKey = CONFIG_MAP_KEY
    """The ConfigMap's key that holds the file."""
    eviction: MigEviction = MigEviction()
    """How the pods on the GPUs being re-carved are evicted."""
    deadlines: MigDeadlines = MigDeadlines()
    """How long each step of a reconfiguration may take."""

    @model_validator(mode="after")
    def _one_source(self) -> MigPolicy:
        if self.config is not None and self.config_map is not None:
            raise PydanticCustomError(
                "mig_source", "set config or configMap, not both", {"field": "configMap"}
            )
        if self.config is not None:
            try:
                migconfig.parse(self.config)
            except migconfig.MigConfigError as error:
                raise PydanticCustomError(
                    "mig_config", "{problem}", {"field": "config", "problem": str(error)}
                ) from None
        return self

    @property
    def configs_source(self) -> str:
        """Where the configs come from, in words (every problem with them names it)."""
        if self.config_map is not None:
            return f"ConfigMap {self.config_map} key {self.config_map_key}"
        if self.config is not None:
            return "the policy's mig.config"
        return "no MIG configs (the policy sets neither mig.config nor mig.configMap)"


def parse_configs(text: str, source: str) -> migconfig.MigConfigFile:
    """A mig-parted file's configs; `ValueError` naming `source` (where the file came from,
    `MigPolicy.configs_source`) when it does not parse."""
    try:
        return migconfig.parse(text)
    except migconfig.MigConfigError as error:
        raise ValueError(f"{source}: {error}") from None
