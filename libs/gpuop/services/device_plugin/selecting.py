"""Which of the `--config` file's configs a node runs, and what that config shares: pure.

Upstream runs one named config per node, chosen by the Node label
`nvidia.com/device-plugin.config` (its config-manager sidecar watches the label and makes
the plugin restart on the config it names). Here the choice is `select`:

    the label names a config          that config                           selected
    no label (or an empty one)        the default                           default
    a label naming no config          the default; the problem is logged,   unknown
                                      counted and reported to the cluster
    the file, read again for the      the config in force stays             refused
    switch, no longer validates       (`DevicePlugins.select`, `refused`)

Upstream's sidecar exits on a label that names no config, leaving the plugin on whatever
it ran; falling back to the default instead keeps a mistyped label from leaving a new node
with no config at all, and `device.plugin-config-applied` (outcome `unknown`) tells the
cluster. A file holding a single config is one named `default`.

`sharing` is what the config in force implies for GPU Feature Discovery's labels:
`nvidia.com/gpu.replicas`, `nvidia.com/gpu.sharing-strategy` (`time-slicing` or `mps`, and
with `mps` `nvidia.com/mps.capable=true`), and whether the product label gets `-SHARED`
(upstream: a shared `nvidia.com/gpu` that is not renamed).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuop.events.device import PLUGIN_CONFIG_LABEL, ConfigOutcome, SharingStrategy
from gpuop.services.device_plugin.config import GPU_RESOURCE, DevicePluginConfig, PluginConfigs

CONFIG_LABEL = PLUGIN_CONFIG_LABEL
"""The Node label that names a node's config, as upstream's."""


@dataclass(frozen=True)
class Selection:
    """The config a node runs, and why."""

    name: str
    """Its name in the file (`default` for a single config)."""
    config: DevicePluginConfig
    requested: str | None
    """The label value it answers; None without a label."""
    outcome: ConfigOutcome
    problem: str | None = None
    """Why the label's config is not the one in force."""


@dataclass(frozen=True)
class Sharing:
    """What a config implies for the `nvidia.com/gpu` labels."""

    replicas: int = 1
    strategy: SharingStrategy = SharingStrategy.NONE
    renamed: bool = False
    """Advertised as `nvidia.com/gpu.shared`; the product label then has no `-SHARED`."""


def select(configs: PluginConfigs, requested: str | None) -> Selection:
    """The config for a node whose label is `requested` (None: no label)."""
    if not requested:
        return Selection(configs.default, configs.default_config, None, ConfigOutcome.DEFAULT)
    config = configs.configs.get(requested)
    if config is not None:
        return Selection(requested, config, requested, ConfigOutcome.SELECTED)
    if configs.named:
        known = ", ".join(sorted(configs.configs))
        problem = f"{CONFIG_LABEL}={requested} names no config (there are {known})"
    else:
        problem = f"{CONFIG_LABEL}={requested}: the --config file holds a single config"
    return Selection(
        configs.default, configs.default_config, requested, ConfigOutcome.UNKNOWN, problem
    )


def refused(current: Selection, requested: str | None, why: str) -> Selection:
    """The answer to a switch that cannot be made: `current` stays in force."""
    return Selection(current.name, current.config, requested, ConfigOutcome.REFUSED, why)


def sharing(config: DevicePluginConfig) -> Sharing:
    """How `config` shares `nvidia.com/gpu`: time-sliced, with MPS, or not at all."""
    shared = config.sharing
    replicas = shared.replicas(GPU_RESOURCE)
    if replicas == 1:
        return Sharing()
    strategy = SharingStrategy.MPS if shared.uses_mps else SharingStrategy.TIME_SLICING
    return Sharing(replicas, strategy, renamed=shared.rename_by_default)
