"""The driver-manager's own configuration: the `--config` file of `gpuop run driver-manager`.

Read once at start by `agent.main`; a YAML (or JSON) mapping whose keys are the fields below,
every one optional. Unknown keys are an error, so a typo does not silently fall back to a
default on a production node.

    components: [gpu, ofed]        driver stacks this agent manages
    kernel: auto                   how modules are changed (see `KernelMode`)
    trust: {}                      the node's own driver trust anchor (`anchors`): public_keys,
                                   sources (URI prefixes), allow_unsigned, ca_bundle,
                                   min_versions, max_index_age_seconds; trusts nothing unset
    driver_source: null            source for a rollback whose command names none: a URI,
                                   or {uri, public_keys, allow_unsigned, ca_bundle}
    connect_timeout_seconds: 10    driver source: connecting
    read_timeout_seconds: 60       driver source: silence while reading
    max_package_bytes: 4294967296  larger packages are refused
    load_modules: {gpu: [nvidia, nvidia_uvm], ofed: [mlx5_core, ib_core, mlx5_ib]}
    unload_poll_seconds: 1.0       how often an unload retries while the driver is in use
    ack_wait_seconds: 30           bus: a silent (killed) agent's command is redelivered after
    max_deliver: 10                bus: deliveries of one command before it is dead-lettered
    install_pause_seconds: 0       fault injection for crash tests (see the field)
    load_pause_seconds: 0          fault injection for crash tests (see the field)
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from gpuop.events.driver import Component, DriverSource
from gpuop.runtime.settings import load_config_file
from gpuop.services.driver_manager.anchors import TrustAnchor


class KernelMode(enum.StrEnum):
    """Which `KernelOps` the agent changes modules with, and so how it reboots."""

    AUTO = "auto"
    """`simulated` when `--nvml sim:<gpus>` (a simulated node), otherwise `host`."""
    HOST = "host"
    """A real node: kmod's tools chrooted into the host root; reboot with
    `chroot <host root> systemctl reboot`."""
    SIMULATED = "simulated"
    """A simulated node: `SimKernel` on the host root, in process; reboot is
    `SimKernel.reboot`."""
    STANDINS = "standins"
    """The real subprocess path without chroot: `modprobe`, `rmmod`, `depmod` from PATH told
    the host root by `GPUOP_HOST_ROOT`, as the stand-ins of `gpuop_sim.host.standins` are. Only
    for simulated hosts, so reboot is `SimKernel.reboot` too."""


DEFAULT_LOAD_MODULES: dict[Component, tuple[str, ...]] = {
    Component.GPU: ("nvidia", "nvidia_uvm"),
    Component.OFED: ("mlx5_core", "ib_core", "mlx5_ib"),
}


def _uri_alone(value: object) -> object:
    return {"uri": value} if isinstance(value, str) else value


class DriverManagerConfig(BaseModel):
    """Everything in the `--config` file; the defaults suit a real node."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    components: tuple[Component, ...] = (Component.GPU, Component.OFED)
    """Driver stacks this agent manages; a command for another one fails without acting."""
    kernel: KernelMode = KernelMode.AUTO
    """How kernel modules are changed and how the node reboots."""
    trust: TrustAnchor = TrustAnchor()
    """The node's own driver trust anchor: the sources, keys and versions it installs from,
    whatever a command names (`anchors`). The default trusts no source."""
    driver_source: Annotated[DriverSource | None, BeforeValidator(_uri_alone)] = None
    """Driver source (directory or http(s) URL holding `index.json`) for a rollback to a
    version that is no longer installed when the command names no source, with the keys its
    index is signed with (`public_keys`, or `allow_unsigned: true`), as a command's source
    carries them; a plain URI is a source with the anchor's keys. The anchor (`trust`)
    admits it as it admits a command's."""
    connect_timeout_seconds: Annotated[float, Field(gt=0, le=600)] = 10.0
    """How long connecting to an http(s) driver source may take."""
    read_timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = 60.0
    """How long an http(s) driver source may stay silent while sending."""
    max_package_bytes: Annotated[int, Field(gt=0)] = 4 << 30
    """Packages (and indexes) larger than this are refused before they fill the disk."""
    load_modules: dict[Component, tuple[str, ...]] = Field(
        default_factory=lambda: dict(DEFAULT_LOAD_MODULES)
    )
    """Modules `load` loads when no earlier unload on this host recorded which were loaded."""
    unload_poll_seconds: Annotated[float, Field(gt=0, le=60)] = 1.0
    """Pause between unload attempts while the driver is in use, up to the command's
    timeout."""
    ack_wait_seconds: Annotated[float, Field(gt=0, le=3600)] = 30.0
    """Seconds the bus waits for word from the agent before redelivering a command; a
    running command keeps extending it, so this is how soon a killed agent's successor
    resumes."""
    max_deliver: Annotated[int, Field(ge=1, le=1000)] = 10
    """Deliveries of one command (restarts included) before it is dead-lettered."""
    install_pause_seconds: Annotated[float, Field(ge=0, le=3600)] = 0.0
    """Fault injection, for crash tests only: an install sleeps this long after unpacking
    into its staging directory and before the rename that installs it, so a test can kill
    the agent at the worst moment. Keep 0 on real nodes."""
    load_pause_seconds: Annotated[float, Field(ge=0, le=3600)] = 0.0
    """Fault injection, for crash tests only: a load sleeps this long after the modules are
    in and before the agent records and answers it, so a test can kill the agent with the new
    driver loaded but not yet reported. Keep 0 on real nodes."""

    def modules_to_load(self, component: Component) -> tuple[str, ...]:
        return self.load_modules.get(component, DEFAULT_LOAD_MODULES[component])


def load(path: Path | None) -> DriverManagerConfig:
    """The configuration in `path` (YAML or JSON); the defaults when `path` is None.
    Raises `SettingsError` naming the file and the first wrong key."""
    return load_config_file(path, DriverManagerConfig)
