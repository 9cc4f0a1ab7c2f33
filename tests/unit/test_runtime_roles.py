"""`services.by_role`: a two-role service reads its config, then runs the module its role
names, importing that module alone (a node agent must not carry the cluster role's imports)."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpuop.bus import InMemoryBus
from gpuop.runtime import services
from gpuop.runtime.settings import Role, Settings

NODE_MODULE = "gpuop_test_roles.node"
CLUSTER_MODULE = "gpuop_test_roles.cluster"
"""Never installed: importing it fails, so a role that imports it shows."""


def _context(role: Role) -> services.ServiceContext:
    settings = Settings(service="test", role=role, node="n1", config=Path("/etc/test.yaml"))
    return services.ServiceContext(settings, InMemoryBus(), CollectorRegistry())


def _role_module(monkeypatch: pytest.MonkeyPatch, ran: list[tuple[str, Any]]) -> None:
    module = types.ModuleType(NODE_MODULE)

    async def run(context: services.ServiceContext, config: Any) -> None:
        ran.append((context.settings.role, config))

    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, NODE_MODULE, module)


async def test_the_node_role_runs_its_module_with_the_config_and_imports_no_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[tuple[str, Any]] = []
    _role_module(monkeypatch, ran)
    read: list[Path | None] = []

    def load_config(path: Path | None) -> str:
        read.append(path)
        return "config"

    main = services.by_role(load_config, NODE_MODULE, CLUSTER_MODULE)
    await main(_context(Role.NODE))

    assert ran == [(Role.NODE, "config")]
    assert read == [Path("/etc/test.yaml")]
    assert CLUSTER_MODULE not in sys.modules


async def test_the_cluster_role_imports_the_cluster_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[tuple[str, Any]] = []
    _role_module(monkeypatch, ran)
    main = services.by_role(lambda path: None, NODE_MODULE, CLUSTER_MODULE)

    with pytest.raises(ModuleNotFoundError, match="gpuop_test_roles"):
        await main(_context(Role.CLUSTER))
    assert ran == []
