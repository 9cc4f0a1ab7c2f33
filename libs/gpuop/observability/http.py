"""The small HTTP server every gpuop service runs: `/healthz`, `/readyz` and `/metrics`.

The service entry point starts one `HealthServer` on `--metrics-listen` before it connects to
anything, so the kubelet's liveness probe passes while the service waits for NATS or the
Kubernetes API, and the readiness probe reports what it is still waiting for.

- `/healthz` answers 200 as long as the event loop runs: a wedged loop fails the probe.
- `/readyz` answers 200 or 503 from the service's readiness check, with a JSON reason.
- `/metrics` renders the registry in the text format the scraper asks for (Prometheus text or
  OpenMetrics). Collection is cheap because exporters gather off the scrape path. A service
  that keeps its own pre-rendered Prometheus text (telemetry's GPU metrics, rendered once per
  collection with dcgm-exporter's exact names) passes it as `exposition`; the response is
  then Prometheus text, the registry's followed by those bytes as they are. Bytes marked
  `Complete` already hold a render of the registry and are served alone: a scrape is then a
  copy, with no rendering on the scrape path at all.

It is HTTP/1.1 on asyncio's streams, not a web framework: three GET routes need a request line
and a few headers, and every node agent runs one, where aiohttp's import alone was a tenth
of its resident memory. Connections are kept alive (Prometheus reuses its connection), a
request head is bounded in size and time, and anything but GET or HEAD of the three paths
gets a plain 404 or 405.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, generate_latest

from gpuop import lifecycles
from gpuop.observability.webconfig import BasicAuth, WebConfig

_log = logging.getLogger(__name__)

Readiness = bool | tuple[bool, str]
"""Ready or not, optionally with the reason it is not."""
ReadinessCheck = Callable[[], Readiness | Awaitable[Readiness]]
"""Answers whether the service can do its job now; may be a plain or an async function."""
Exposition = Callable[[], bytes | None]
"""Pre-rendered Prometheus text (format 0.0.4) to serve after the registry's; None: nothing."""


class Complete(bytes):
    """An exposition that begins with its own render of the registry: served as it is."""


MAX_HEAD_BYTES = 16 * 1024
"""A request line and headers longer than this are refused (431) and the connection closed."""
IDLE_SECONDS = 60.0
"""A kept-alive connection with no new request for this long is closed; also the bound on
reading one request head, so a slow client cannot hold a connection open for ever."""
_JSON = "application/json; charset=utf-8"
_TEXT = "text/plain; charset=utf-8"
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 431: "Request Header Fields Too Large",
            503: "Service Unavailable"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Response:
    status: int
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def json(cls, document: object, status: int = 200) -> _Response:
        return cls(status, json.dumps(document).encode(), _JSON)


class HealthServer(lifecycles.Startable):
    """Serves health, readiness and metrics for one process until `stop()`."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        readiness: ReadinessCheck | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        readiness_timeout: float = 2.0,
        exposition: Exposition | None = None,
        web_config: WebConfig | None = None,
    ) -> None:
        self._registry = registry
        self._readiness = readiness
        self._exposition = exposition
        self._host = host
        self._port = port
        # Below the kubelet's probe timeout, so a hung check reads as "not ready", not "dead".
        self._readiness_timeout = readiness_timeout
        self._web_config = web_config  # None: plain HTTP, no auth (and no model built)
        self._auth = BasicAuth(web_config.basic_auth_users if web_config else {})
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._address: tuple[str, int] | None = None

    @property
    def address(self) -> tuple[str, int] | None:
        """The bound (host, port) while serving, else None."""
        return self._address

    async def start(self) -> tuple[str, int]:
        """Bind and serve; returns the bound (host, port), so port 0 picks a free one."""
        if self._server is not None:
            raise RuntimeError("HealthServer is already started")
        tls = self._web_config.ssl_context() if self._web_config is not None else None
        server = await asyncio.start_server(
            self._serve, self._host, self._port, limit=MAX_HEAD_BYTES, ssl=tls
        )
        sockname = server.sockets[0].getsockname()
        self._server = server
        self._address = (str(sockname[0]), int(sockname[1]))
        scheme = "https" if tls is not None else "http"
        auth = ", /metrics behind basic auth" if self._auth.required else ""
        _log.info("serving /healthz, /readyz and /metrics on %s://%s:%d%s", scheme,
                  *self._address, auth)  # fmt: skip
        return self._address

    async def stop(self) -> None:
        """Stop serving and close every open connection; safe to call when not started."""
        server, self._server, self._address = self._server, None, None
        if server is None:
            return
        server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while await self._answer_one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, ssl.SSLError):
            pass  # the client went away, went quiet or failed the TLS handshake
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _answer_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read one request and answer it; whether the connection stays open for another."""
        try:
            async with asyncio.timeout(IDLE_SECONDS):
                head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as short:
            if short.partial.strip():
                await self._send(writer, _Response(400, b"incomplete request\n", _TEXT), False)
            return False
        except asyncio.LimitOverrunError:
            await self._send(writer, _Response(431, b"request head too large\n", _TEXT), False)
            return False
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._send(writer, _Response(400, b"malformed request line\n", _TEXT), False)
            return False
        method, target, version = parts
        headers = {}
        for line in header_lines:
            name, colon, value = line.partition(":")
            if colon:
                headers[name.strip().lower()] = value.strip()
        if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
            # the routes take no body; one left unread would be parsed as the next request
            await self._send(writer, _Response(400, b"no request body expected\n", _TEXT), False)
            return False
        connection = headers.get("connection", "").lower()
        keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        response = await self._route(method, target.split("?", 1)[0], headers)
        await self._send(writer, response, keep_alive, head_only=method == "HEAD")
        return keep_alive

    async def _route(self, method: str, path: str, headers: dict[str, str]) -> _Response:
        routes = {"/healthz": self._healthz, "/readyz": self._readyz, "/metrics": self._metrics}
        route = routes.get(path)
        if route is None:
            return _Response(404, b"not found: try /healthz, /readyz or /metrics\n", _TEXT)
        if method not in ("GET", "HEAD"):
            return _Response(405, f"{method} not allowed: GET only\n".encode(), _TEXT)
        if path == "/metrics" and not self._auth.allows(headers.get("authorization", "")):
            challenge = (("WWW-Authenticate", 'Basic realm="gpuop metrics"'),)
            return _Response(401, b"credentials required for /metrics\n", _TEXT, challenge)
        return await route(headers)

    @staticmethod
    async def _send(
        writer: asyncio.StreamWriter, response: _Response, keep_alive: bool, head_only: bool = False
    ) -> None:
        lines = [
            f"HTTP/1.1 {response.status} {_REASONS.get(response.status, '')}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
            f"Connection: {'keep-alive' if keep_alive else 'close'}",
            *(f"{name}: {value}" for name, value in response.headers),
        ]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if not head_only:
            writer.write(response.body)
        await writer.drain()

    async def _healthz(self, headers: dict[str, str]) -> _Response:
        return _Response.json({"status": "ok"})

    async def _readyz(self, headers: dict[str, str]) -> _Response:
        ready, reason = await self._check_readiness()
        if ready:
            return _Response.json({"ready": True})
        return _Response.json({"ready": False, "reason": reason}, status=503)

    async def _metrics(self, headers: dict[str, str]) -> _Response:
        rendered = self._exposition() if self._exposition is not None else None
        if rendered is not None:
            # dcgm-exporter's counters have no `_total`, which OpenMetrics would require
            body = (
                rendered
                if isinstance(rendered, Complete)
                else generate_latest(self._registry) + rendered
            )
            return _Response(200, body, CONTENT_TYPE_PLAIN_0_0_4)
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        return _Response(200, encoder(self._registry), content_type)

    async def _check_readiness(self) -> tuple[bool, str]:
        if self._readiness is None:
            return True, ""
        try:
            answer = self._readiness()
            if inspect.isawaitable(answer):
                async with asyncio.timeout(self._readiness_timeout):
                    answer = await answer
        except TimeoutError:
            return False, f"readiness check timed out after {self._readiness_timeout:g}s"
        except Exception as error:
            _log.warning("readiness check failed", exc_info=True)
            return False, f"readiness check failed: {type(error).__name__}: {error}"
        if isinstance(answer, tuple):
            ready, reason = answer
            return bool(ready), "" if ready else reason
        return (True, "") if answer else (False, "not ready")
