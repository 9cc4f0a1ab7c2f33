"""What other distributions add to gpuop, found through entry points: the product never imports
them. `gpuop_sim` (this repository's simulation) registers the three kinds below; a missing
plugin is a `PluginMissing` that says what to install.

    gpuop.services   a service `gpuop run` can start (`gpuop.runtime.services`)
    gpuop.commands   a `gpuop` subcommand: `add_parser(verbs)` (`demo`, `sim`)
    gpuop.nvml       an NVML backend for `--nvml <name>:<argument>` (`sim`)
    gpuop.kernels    a kernel and reboot for a host the driver-manager does not own (`simulated`)
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

SIM_DISTRIBUTION = "gpuop-sim"
"""The distribution that provides the simulated backends, in this repository's libs/gpuop-sim."""


class PluginMissing(LookupError):
    """No installed distribution provides a plugin that was asked for."""


def load(group: str, name: str, *, wanted_for: str) -> Any:
    """The object the entry point `name` of `group` names; `PluginMissing` when none is
    installed, naming `wanted_for` (the flag or command that needs it)."""
    found = entry_points(group=group, name=name)
    if not found:
        raise PluginMissing(
            f"{wanted_for} needs the {name!r} plugin of {group}, and no installed distribution"
            f" provides it ({SIM_DISTRIBUTION} provides the simulated ones: pip install"
            f" {SIM_DISTRIBUTION}; in a checkout, `make setup` installs it)"
        )
    return next(iter(found)).load()


def load_all(group: str) -> dict[str, Any]:
    """Every entry point of `group`, loaded, by name."""
    return {point.name: point.load() for point in entry_points(group=group)}
