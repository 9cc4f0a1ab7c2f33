"""How a service declares itself, and how `gpuop run` finds it.

Each package under `gpuop.services` exports `SERVICE`, a `ServiceDefinition`, registered as
an entry point in the `gpuop.services` group of pyproject.toml. The shared library finds
services through those entry points and never imports a service module by name, so the
layering holds: services depend on `gpuop`, never the reverse.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points

from prometheus_client import CollectorRegistry

from gpuop.bus import Bus
from gpuop.runtime.settings import Role, Settings

ENTRY_POINT_GROUP = "gpuop.services"


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


ServiceMain = Callable[[ServiceContext], Awaitable[None]]


@dataclass(frozen=True)
class ServiceDefinition:
    """A service's name, the roles it has, and its entry point."""

    name: str
    summary: str
    roles: frozenset[Role]
    main: ServiceMain | None = None
    """Runs until `context.stopping` is set; None while the service is not built yet."""
    pending_issue: int | None = None
    """The issue that builds this service, while `main` is None."""


class UnknownService(LookupError):
    """`gpuop run` was asked for a service that is not installed."""


def installed() -> dict[str, ServiceDefinition]:
    """Every installed service, by name."""
    found: dict[str, ServiceDefinition] = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        definition = entry.load()
        if not isinstance(definition, ServiceDefinition):
            raise TypeError(f"entry point {entry.value} is not a ServiceDefinition")
        found[definition.name] = definition
    return dict(sorted(found.items()))


def lookup(name: str) -> ServiceDefinition:
    services = installed()
    if name not in services:
        raise UnknownService(f"unknown service {name!r}; installed: {', '.join(services)}")
    return services[name]
