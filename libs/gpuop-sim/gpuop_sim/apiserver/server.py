"""The simulated API server: its aiohttp application and lifecycle.

``ApiServer`` assembles the pieces (catalog, store, registry, controllers, HTTP handlers),
binds ``127.0.0.1`` on a free port, requires a random bearer token, and records every
request: in ``request_log`` as it came, and counted by verb, resource and scope in
``requests`` (``accounting.py``). Tests and ``gpuop sim apiserver`` start it with
``async with ApiServer() as server``; clients connect through
``server.write_kubeconfig(path)``; simulation components in the same process (the simulated
kubelet) use ``server.registry`` and ``server.store``. ``server.faults`` (``faults.py``)
makes it answer some requests with 500 or 429 before they run, and end watches early.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import socket
from collections import Counter
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

from aiohttp import web
from aiohttp.typedefs import Handler

from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop_sim.apiserver import errors, handlers, kinds
from gpuop_sim.apiserver import kubeconfig as kubeconfigs
from gpuop_sim.apiserver.accounting import RequestKind, classify
from gpuop_sim.apiserver.crds import CrdController
from gpuop_sim.apiserver.faults import FaultPlan
from gpuop_sim.apiserver.garbage import GarbageCollector
from gpuop_sim.apiserver.namespaces import NamespaceController
from gpuop_sim.apiserver.nodes import UnschedulableTaintController
from gpuop_sim.apiserver.pdb import DisruptionController
from gpuop_sim.apiserver.registry import Registry
from gpuop_sim.apiserver.resources import Catalog
from gpuop_sim.apiserver.store import Store

Obj = dict[str, Any]

logger = logging.getLogger(__name__)

INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_UNAUTHENTICATED = frozenset({"/healthz", "/livez", "/readyz"})


class RequestRecord(NamedTuple):
    """One served request, logged when its response starts."""

    method: str
    path: str
    query: str
    status: int
    content_type: str


class ApiServer:
    """A Kubernetes API server over HTTP on loopback, faithful to what gpuop relies on."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        kubelet_delay: float | None = 0.0,
        bookmark_interval: float = 5.0,
        history_limit: int = 100_000,
        taint_unschedulable_nodes: bool = True,
        anonymous_auth: bool = False,
        faults: FaultPlan | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``kubelet_delay``: seconds until a gracefully deleted pod bound to a node is
        confirmed gone (capped by its grace period); None leaves that to a simulated
        kubelet calling :meth:`complete_pod_termination`. ``bookmark_interval``: seconds
        between BOOKMARK events on watches that allow them. ``anonymous_auth``: also serve
        requests that carry no credentials, as kube-apiserver's ``--anonymous-auth`` with
        RBAC granting ``system:anonymous`` everything; kubectl and other client-go tools
        need it, because they send no bearer token over plain HTTP. A wrong token is
        still refused. ``faults``: what to get wrong on purpose (none by default); tests may
        change it, or replace it, while the server runs."""
        self._host = host
        self._port = port
        self.token = token or secrets.token_urlsafe(32)
        self.anonymous_auth = anonymous_auth
        self.faults = faults if faults is not None else FaultPlan()
        self.bookmark_interval = bookmark_interval
        self.catalog = Catalog()
        for resource in kinds.BUILTIN:
            self.catalog.register(resource)
        self.store = Store(history_limit=history_limit)
        self.registry = Registry(self.store, self.catalog, clock=clock, kubelet_delay=kubelet_delay)
        self.disruption_controller = DisruptionController(self.registry)
        CrdController(self.registry)
        NamespaceController(self.registry)
        GarbageCollector(self.registry)
        if taint_unschedulable_nodes:
            UnschedulableTaintController(self.registry)
        self.request_log: list[RequestRecord] = []
        self.requests: Counter[RequestKind] = Counter()
        """Requests served so far, by verb, resource and scope (``accounting.py``)."""
        self._runner: web.AppRunner | None = None
        self._bound_port = 0

    @property
    def url(self) -> str:
        if self._runner is None:
            raise RuntimeError("the API server is not running")
        return f"http://{self._host}:{self._bound_port}"

    async def start(self) -> None:
        for name in INITIAL_NAMESPACES:
            if self.store.get(kinds.NAMESPACES.group_resource, "", name) is None:
                self.registry.create(kinds.NAMESPACES, "", {"metadata": {"name": name}})
        routes = handlers.Handlers(
            self.registry,
            bookmark_interval=self.bookmark_interval,
            server_address=lambda: f"{self._host}:{self._bound_port}",
            watch_opened=lambda end: self.faults.watch_opened(end),
        )
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", routes.dispatch)
        app.on_response_prepare.append(self._record)
        # Cancel a handler when its client disconnects, so abandoned watches unregister.
        runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0
        )
        await runner.setup()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self._host, self._port))
            self._bound_port = listener.getsockname()[1]
            await web.SockSite(runner, listener).start()
        except BaseException:
            listener.close()
            await runner.cleanup()
            raise
        self._runner = runner
        logger.info("simulated API server listening on %s", self.url)

    async def stop(self) -> None:
        if self._runner is None:
            return
        self.store.close_watchers()
        self.registry.close()
        self.disruption_controller.close()
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def __aenter__(self) -> ApiServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    def write_kubeconfig(
        self, path: Path, *, context: str = kubeconfigs.DEFAULT_CONTEXT, namespace: str = "default"
    ) -> Path:
        return kubeconfigs.write_kubeconfig(
            path, self.url, self.token, context=context, namespace=namespace
        )

    # Test hooks.

    def seed(self, obj: Obj) -> Obj:
        """Insert or replace an object directly (status included, no validation)."""
        return self.registry.seed(obj)

    def compact(self) -> None:
        """Drop the watch history: watches from any earlier resourceVersion get 410."""
        self.store.compact()

    def pause_pdb_controller(self) -> None:
        self.disruption_controller.pause()

    def resume_pdb_controller(self) -> None:
        self.disruption_controller.resume()

    def complete_pod_termination(self, namespace: str, name: str) -> None:
        """Confirm, as the kubelet would, that a terminating pod's containers are gone."""
        self.registry.complete_pod_termination(namespace, name)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            unauthenticated = request.path in _UNAUTHENTICATED
            if not unauthenticated and not self._authorized(request):
                raise errors.unauthorized()
            # Before the handler, so that a faulted request has no effect, as when
            # kube-apiserver's fairness filter (429) or its storage (500) refuses one.
            fault = None if unauthenticated else self.faults.fault(request.method, request.path)
            response = fault if fault is not None else await handler(request)
        except errors.ApiError as error:
            response = handlers.error_response(error)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            logger.exception("simulated API server failed on %s %s", request.method, request.path)
            response = handlers.error_response(errors.internal(repr(error)))
        return response

    async def _record(self, request: web.Request, response: web.StreamResponse) -> None:
        """Log a request as its response starts, so watches are logged while they stream."""
        self.request_log.append(
            RequestRecord(
                request.method,
                request.path,
                request.query_string,
                response.status,
                request.headers.get("Content-Type", ""),
            )
        )
        self.requests[classify(request.method, request.path, dict(request.query))] += 1

    def _authorized(self, request: web.Request) -> bool:
        if "Authorization" not in request.headers:
            return self.anonymous_auth
        scheme, _, credential = request.headers["Authorization"].partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(credential, self.token)
