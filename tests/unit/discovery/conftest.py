"""A simulated 2-GPU node for discovery's node agent, on the in-memory bus."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuop.bus import InMemoryBus
from gpuop.host.roots import HostRoot
from gpuop.nvml import open_backend
from gpuop.services.discovery.config import DiscoveryConfig
from gpuop.services.discovery.node_agent import NodeAgent
from gpuop_sim.cluster import hosts
from tests.support.node_agents import NODE
from tests.unit.discovery.support import BOOT_ID, QUIET, CountingNvml


@pytest.fixture
def host(tmp_path: Path) -> HostRoot:
    return hosts.build_host_root(tmp_path / "host", NODE, 2, boot_id=BOOT_ID)


@pytest.fixture
def nvml(host: HostRoot) -> CountingNvml:
    return CountingNvml(
        open_backend("sim:2", host_root=host.path, node=NODE, holder_id="discovery")
    )


@pytest.fixture
def make_agent(bus: InMemoryBus, host: HostRoot, nvml: CountingNvml) -> Callable[..., NodeAgent]:
    def make(config: DiscoveryConfig = QUIET, readiness: Any = None) -> NodeAgent:
        return NodeAgent(bus, NODE, host, nvml, config, readiness=readiness)  # type: ignore[arg-type]

    return make
