"""Fixtures for the simulated API server suite: one server per test, reached through the
official ``kubernetes.aio`` client loaded from the kubeconfig the server writes, plus a raw
HTTPS session for what the client hides (headers, in-stream errors, bookmarks)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes.aio import client, config

from gpuop_sim import ApiServer
from tests.integration.sim.support import RawApi


@pytest.fixture(autouse=True)
def no_server_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Fail a test during which the server logged an error: a controller that raised, or a
    request answered with 500 InternalError. The server logs instead of failing the write."""
    yield
    errors = [
        record.getMessage()
        for record in caplog.get_records("call")
        if record.name.startswith("gpuop_sim") and record.levelno >= logging.ERROR
    ]
    assert not errors, f"the simulated API server logged errors: {errors}"


@pytest.fixture
async def server() -> AsyncIterator[ApiServer]:
    async with ApiServer(bookmark_interval=0.2, kubelet_delay=None) as running:
        yield running


@pytest.fixture
def kubeconfig(server: ApiServer, tmp_path: Path) -> Path:
    return server.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
async def api(kubeconfig: Path) -> AsyncIterator[client.ApiClient]:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    async with client.ApiClient(configuration) as api_client:
        yield api_client


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
async def raw(server: ApiServer) -> AsyncIterator[RawApi]:
    async with RawApi(server.url, server.token, server.ssl_context()) as session:
        yield session
