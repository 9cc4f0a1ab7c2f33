"""The health, readiness and metrics endpoints every service serves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter

from gpuop.observability import metrics
from gpuop.observability.http import Complete, HealthServer


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


async def _exchange(server: HealthServer, raw: bytes) -> bytes:
    """Send `raw` on a fresh connection and read until the server closes it."""
    assert server.address is not None
    reader, writer = await asyncio.open_connection(*server.address)
    writer.write(raw)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()
    return answer


async def test_a_kept_alive_connection_answers_several_requests_in_turn(client):
    async with HealthServer(CollectorRegistry()) as server:
        for _ in range(3):  # aiohttp's session reuses its one connection
            async with client.get(url(server, "/healthz")) as response:
                assert response.headers["Connection"] == "keep-alive"
        raw = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        raw += b"GET /readyz HTTP/1.1\r\nConnection: close\r\n\r\n"
        answer = await _exchange(server, raw)
    assert answer.count(b"HTTP/1.1 200 OK") == 2
    assert answer.endswith(b'{"ready": true}')


async def test_unknown_paths_other_methods_and_head_get_what_http_says(client):
    async with HealthServer(CollectorRegistry()) as server:
        async with client.get(url(server, "/nothing")) as missing:
            assert missing.status == 404
            assert "/healthz" in await missing.text()
        async with client.post(url(server, "/healthz")) as posted:
            assert posted.status == 405
        head = await _exchange(server, b"HEAD /healthz HTTP/1.0\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n")
    assert b"Content-Length: 16" in head and b"Connection: close" in head


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GARBAGE\r\n\r\n", b"400"),
        (b"GET /healthz SPDY/3\r\n\r\n", b"400"),
        (b"GET /healthz HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody", b"400"),
        (b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"a" * 20_000 + b"\r\n\r\n", b"431"),
        (b"GET /healthz HTT", b"400"),  # the client gave up half way
    ],
)
async def test_a_malformed_request_gets_a_clear_error_and_the_connection_closed(raw, status):
    async with HealthServer(CollectorRegistry()) as server:
        writer_closed = await _exchange_half_closed(server, raw)
        assert writer_closed.startswith(b"HTTP/1.1 " + status), writer_closed[:80]
        assert b"Connection: close" in writer_closed
        assert await _exchange(server, b"GET /healthz HTTP/1.0\r\n\r\n")  # still serving


async def _exchange_half_closed(server: HealthServer, raw: bytes) -> bytes:
    """Send `raw`, then end the sending side (a client that stops mid-request), and read."""
    assert server.address is not None
    reader, writer = await asyncio.open_connection(*server.address)
    writer.write(raw)
    writer.write_eof()
    answer = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()
    return answer


async def test_stop_closes_an_idle_kept_alive_connection():
    server = HealthServer(CollectorRegistry())
    host, port = await server.start()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    await asyncio.wait_for(server.stop(), timeout=5)  # does not wait for the client
    await reader.readexactly(16)  # the body; then the server's close
    assert await asyncio.wait_for(reader.read(), timeout=5) == b""
    writer.close()


async def test_an_exposition_follows_the_registry_unless_it_is_complete(client):
    registry = CollectorRegistry()
    requests = Counter("gpuop_test_requests", "Requests.", registry=registry)
    served: list[bytes] = [b"DCGM_FI_DEV_GPU_TEMP 34\n"]
    async with HealthServer(registry, exposition=lambda: served[0]) as server:
        async with client.get(url(server, "/metrics")) as response:
            appended = await response.read()
        served[0] = Complete(b"# rendered earlier\nDCGM_FI_DEV_GPU_TEMP 35\n")
        requests.inc()
        async with client.get(url(server, "/metrics")) as response:
            complete = await response.read()

    assert appended.startswith(b"# HELP gpuop_test_requests_total")
    assert appended.endswith(b"DCGM_FI_DEV_GPU_TEMP 34\n")
    assert complete == b"# rendered earlier\nDCGM_FI_DEV_GPU_TEMP 35\n"  # no render per scrape
