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
  then Prometheus text, the registry's followed by those bytes as they are.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Self

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, generate_latest

_log = logging.getLogger(__name__)

Readiness = bool | tuple[bool, str]
"""Ready or not, optionally with the reason it is not."""
ReadinessCheck = Callable[[], Readiness | Awaitable[Readiness]]
"""Answers whether the service can do its job now; may be a plain or an async function."""
Exposition = Callable[[], bytes | None]
"""Pre-rendered Prometheus text (format 0.0.4) to serve after the registry's; None: nothing."""


class HealthServer:
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
    ) -> None:
        self._registry = registry
        self._readiness = readiness
        self._exposition = exposition
        self._host = host
        self._port = port
        # Below the kubelet's probe timeout, so a hung check reads as "not ready", not "dead".
        self._readiness_timeout = readiness_timeout
        self._runner: web.AppRunner | None = None
        self._address: tuple[str, int] | None = None

    @property
    def address(self) -> tuple[str, int] | None:
        """The bound (host, port) while serving, else None."""
        return self._address

    async def start(self) -> tuple[str, int]:
        """Bind and serve; returns the bound (host, port), so port 0 picks a free one."""
        if self._runner is not None:
            raise RuntimeError("HealthServer is already started")
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        # Probes every few seconds would drown the service's own log lines.
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self._host, self._port).start()
        except BaseException:
            await runner.cleanup()
            raise
        sockname = runner.addresses[0]
        self._runner = runner
        self._address = (str(sockname[0]), int(sockname[1]))
        _log.info("serving /healthz, /readyz and /metrics on %s:%d", *self._address)
        return self._address

    async def stop(self) -> None:
        """Stop serving; safe to call when not started."""
        runner, self._runner, self._address = self._runner, None, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        ready, reason = await self._check_readiness()
        if ready:
            return web.json_response({"ready": True})
        return web.json_response({"ready": False, "reason": reason}, status=503)

    async def _metrics(self, request: web.Request) -> web.Response:
        rendered = self._exposition() if self._exposition is not None else None
        if rendered is not None:
            # dcgm-exporter's counters have no `_total`, which OpenMetrics would require
            body = generate_latest(self._registry) + rendered
            response = web.Response(body=body)
            response.headers["Content-Type"] = CONTENT_TYPE_PLAIN_0_0_4
            return response
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        response = web.Response(body=encoder(self._registry))
        # aiohttp's content_type argument refuses parameters such as charset and version.
        response.headers["Content-Type"] = content_type
        return response

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
