"""How a service declares itself, and how `gpuop run` finds it.

Each package under `gpuop.services` exports `SERVICE`, a `ServiceDefinition`, registered as
an entry point in the `gpuop.services` group of pyproject.toml. The shared library finds
services through those entry points and never imports a service module by name, so the
layering holds: services depend on `gpuop`, never the reverse.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpuop.bus import Bus
from gpuop.observability.http import Exposition
from gpuop.runtime.settings import Role, Settings

ENTRY_POINT_GROUP = "gpuop.services"

Readiness = Callable[[bool, str], None]
"""Told (ready, reason) whenever a service part's readiness changes; in a running service,
`ServiceContext.set_readiness`."""


@dataclass
class ServiceContext:
    """What a running service is handed: its settings, the bus, its metrics, its readiness."""

    settings: Settings
    bus: Bus
    registry: CollectorRegistry
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    ready: bool = False
    """Reported by /readyz; a service sets it once it does its job."""
    not_ready_reason: str = "starting"
    exposition: Exposition | None = None
    """Pre-rendered Prometheus text /metrics serves after the registry's; a service whose
    metric names the registry cannot express (telemetry's dcgm-exporter set) sets it."""

    def set_readiness(self, ready: bool, reason: str) -> None:
        """What /readyz reports from now on (a `Readiness` to hand the service's parts)."""
        self.ready = ready
        self.not_ready_reason = reason


ServiceMain = Callable[[ServiceContext], Awaitable[None]]


def by_role(load_config: Callable[[Path | None], object], node: str, cluster: str) -> ServiceMain:
    """The main of a service with a node and a cluster role: reads `--config` with
    `load_config`, then runs `run(context, config)` of the module `--role` names (`node` or
    `cluster`, dotted names). Only that module is imported, so a process carries its own
    role's imports alone (a node agent no Kubernetes client, a cluster role no netlink)."""

    async def main(context: ServiceContext) -> None:
        config = load_config(context.settings.config)
        role = importlib.import_module(node if context.settings.role is Role.NODE else cluster)
        await role.run(context, config)

    return main


@dataclass(frozen=True)
class ServiceDefinition:
    """A service's name, the roles it has, and its entry point."""

    name: str
    summary: str
    roles: frozenset[Role]
    main: ServiceMain
    """Runs until `context.stopping` is set."""


class UnknownService(LookupError):
    """`gpuop run` was asked for a service that is not installed."""


def installed() -> dict[str, ServiceDefinition]:
    """Every installed service, by name."""
    found = {entry.name: _load(entry) for entry in entry_points(group=ENTRY_POINT_GROUP)}
    return dict(sorted(found.items()))


def names() -> list[str]:
    """The installed services' names, read from the entry points without importing any."""
    return sorted(entry.name for entry in entry_points(group=ENTRY_POINT_GROUP))


def lookup(name: str) -> ServiceDefinition:
    """The service `name`, importing only its own package: a process runs one service and
    should not carry the others' imports (gRPC, netlink) to its exit."""
    for entry in entry_points(group=ENTRY_POINT_GROUP, name=name):
        return _load(entry)
    raise UnknownService(f"unknown service {name!r}; installed: {', '.join(names())}")


def _load(entry: EntryPoint) -> ServiceDefinition:
    definition = entry.load()
    if not isinstance(definition, ServiceDefinition) or definition.name != entry.name:
        raise TypeError(f"entry point {entry.name} = {entry.value} is not its ServiceDefinition")
    return definition
