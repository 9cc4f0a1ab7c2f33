"""Fixtures for the driver-manager tests: a seeded simulated host, a driver source with two
GPU and two OFED versions, an in-memory bus, and an agent running on them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuop.bus import InMemoryBus
from gpuop.host import packaging
from gpuop.host.roots import HostRoot
from tests.support.driver_manager import Harness, build_source, running_agent, seed


@pytest.fixture
def host(tmp_path: Path) -> HostRoot:
    return seed(tmp_path / "host")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    build_source(tmp_path / "source")
    return tmp_path / "source"


@pytest.fixture
def packages_built(source: Path) -> dict[str, packaging.BuiltPackage]:
    return {package.path.name: package for package in build_source(source)}


@pytest.fixture
async def harness(bus: InMemoryBus, host: HostRoot, source: Path) -> AsyncIterator[Harness]:
    async with running_agent(bus, host, source) as running:
        yield running
