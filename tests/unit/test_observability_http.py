"""The health, readiness and metrics endpoints every service serves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from gpuop.observability import metrics
from gpuop.observability.http import HealthServer


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def url(server: HealthServer, path: str) -> str:
    assert server.address is not None
    host, port = server.address
    return f"http://{host}:{port}{path}"


async def test_healthz_answers_ok_while_serving(client):
    async with (
        HealthServer(CollectorRegistry()) as server,
        client.get(url(server, "/healthz")) as response,
    ):
        assert response.status == 200
        assert await response.json() == {"status": "ok"}


async def test_readyz_flips_from_503_to_200_when_the_check_passes(client):
    ready = False
    async with HealthServer(CollectorRegistry(), readiness=lambda: ready) as server:
        async with client.get(url(server, "/readyz")) as before:
            assert before.status == 503
            assert await before.json() == {"ready": False, "reason": "not ready"}
        ready = True
        async with client.get(url(server, "/readyz")) as after:
            assert after.status == 200
            assert await after.json() == {"ready": True}


async def test_readyz_without_a_check_is_ready(client):
    async with (
        HealthServer(CollectorRegistry()) as server,
        client.get(url(server, "/readyz")) as response,
    ):
        assert response.status == 200


async def test_readyz_accepts_an_async_check(client):
    async def connected() -> bool:
        await asyncio.sleep(0)
        return True

    async with (
        HealthServer(CollectorRegistry(), readiness=connected) as server,
        client.get(url(server, "/readyz")) as response,
    ):
        assert response.status == 200


async def test_readyz_reports_a_failing_check_as_not_ready(client):
    def broken() -> bool:
        raise ConnectionError("nats unreachable")

    async with (
        HealthServer(CollectorRegistry(), readiness=broken) as server,
        client.get(url(server, "/readyz")) as response,
    ):
        assert response.status == 503
        body = await response.json()
    assert body["reason"] == "readiness check failed: ConnectionError: nats unreachable"


async def test_readyz_reports_a_hung_check_as_not_ready(client):
    async def hangs() -> bool:
        await asyncio.Event().wait()
        return True

    server = HealthServer(CollectorRegistry(), readiness=hangs, readiness_timeout=0.05)
    async with server, client.get(url(server, "/readyz")) as response:
        assert response.status == 503
        assert "timed out" in (await response.json())["reason"]


async def test_metrics_serves_the_registry_as_prometheus_text(client):
    registry = CollectorRegistry()
    metrics.BusMetrics(registry).published("evt")
    async with HealthServer(registry) as server, client.get(url(server, "/metrics")) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    assert 'gpuop_bus_published_total{kind="evt"} 1.0' in text


async def test_metrics_negotiates_openmetrics(client):
    registry = CollectorRegistry()
    metrics.BusMetrics(registry).published("cmd")
    headers = {"Accept": "application/openmetrics-text; version=1.0.0"}
    async with (
        HealthServer(registry) as server,
        client.get(url(server, "/metrics"), headers=headers) as response,
    ):
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
        text = await response.text()
    assert text.endswith("# EOF\n")


async def test_start_binds_a_free_port_and_stop_releases_it(client):
    server = HealthServer(CollectorRegistry())
    host, port = await server.start()
    assert (host, port) == server.address
    assert port > 0
    with pytest.raises(RuntimeError, match="already started"):
        await server.start()
    await server.stop()
    assert server.address is None
    with pytest.raises(aiohttp.ClientConnectorError):
        await client.get(f"http://{host}:{port}/healthz")


async def test_stop_without_start_does_nothing():
    await HealthServer(CollectorRegistry()).stop()


async def test_start_on_a_taken_port_raises_and_leaves_nothing_running():
    async with HealthServer(CollectorRegistry()) as first:
        assert first.address is not None
        second = HealthServer(CollectorRegistry(), port=first.address[1])
        with pytest.raises(OSError):
            await second.start()
        assert second.address is None
