"""One simulated API server per test, reached through `gpuop.kube` and the kubeconfig it
writes, as discovery's cluster role reaches a real cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuop.kube import client
from gpuop_sim import ApiServer


@pytest.fixture
async def server() -> AsyncIterator[ApiServer]:
    async with ApiServer(bookmark_interval=0.2) as running:
        yield running


@pytest.fixture
def kubeconfig(server: ApiServer, tmp_path: Path) -> Path:
    return server.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
async def kube(kubeconfig: Path) -> AsyncIterator[client.Kube]:
    async with await client.connect(kubeconfig) as connected:
        yield connected
