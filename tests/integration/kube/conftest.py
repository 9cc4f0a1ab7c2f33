"""Fixtures for the `gpuop.kube` contract suite: one simulated API server per test, reached
through `gpuop.kube.client.connect` and the kubeconfig the server writes, exactly as the
services reach a real cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuop.kube import client
from gpuop_sim import ApiServer


@pytest.fixture
def kubelet_delay() -> float | None:
    """Seconds until a deleted pod bound to a node is gone; None: until the test says so.
    Override with `@pytest.mark.parametrize("kubelet_delay", [None])`."""
    return 0.0


@pytest.fixture
async def server(kubelet_delay: float | None) -> AsyncIterator[ApiServer]:
    async with ApiServer(bookmark_interval=0.2, kubelet_delay=kubelet_delay) as running:
        yield running


@pytest.fixture
def kubeconfig(server: ApiServer, tmp_path: Path) -> Path:
    return server.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
async def kube(kubeconfig: Path) -> AsyncIterator[client.Kube]:
    async with await client.connect(kubeconfig) as connected:
        yield connected
