"""The simulated API server: its aiohttp application and lifecycle.

``ApiServer`` assembles the pieces (catalog, store, registry, controllers, HTTP handlers),
binds ``127.0.0.1`` on a free port and serves HTTPS only, as kube-apiserver does, with a
throwaway CA made at start (``certificates.py``). It authenticates bearer tokens (the admin
``token``, and those :meth:`ApiServer.add_user` hands out), authorizes every request with
RBAC's rules (``authorizing.py``: 403 ``Forbidden`` otherwise), and records every request:
in ``request_log`` as it came, and counted by verb, resource and scope in ``requests``
(``accounting.py``). Tests and ``gpuop sim apiserver`` start it with
``async with ApiServer() as server``; clients connect through
``server.write_kubeconfig(path)`` (server URL, CA and token), or with
``server.ssl_context()`` for raw HTTP; simulation components in the same process (the
simulated kubelet) use ``server.registry`` and ``server.store``. ``server.faults``
(``faults.py``) makes it answer some requests with 500 or 429 before they run, and end
watches early.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import socket
import ssl
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from aiohttp import web
from aiohttp.typedefs import Handler

from gpuop import lifecycles
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop_sim.apiserver import authorizing, certificates, errors, handlers, kinds
from gpuop_sim.apiserver import kubeconfig as kubeconfigs
from gpuop_sim.apiserver.accounting import RequestKind, classify
from gpuop_sim.apiserver.authorizing import (
    ANONYMOUS,
    AUTHENTICATED,
    EVERYTHING,
    MASTERS,
    UNAUTHENTICATED,
    Authorizer,
    Rule,
    User,
    attributes_of,
)
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
ADMIN = User("gpuop-sim-admin", (MASTERS, AUTHENTICATED), uid="gpuop-sim-admin")
"""Who the admin ``token`` authenticates as: in ``system:masters``, allowed everything."""
_ANONYMOUS = User(ANONYMOUS, (UNAUTHENTICATED,))


class RequestRecord(NamedTuple):
    """One served request, logged when its response starts."""

    method: str
    path: str
    query: str
    status: int
    content_type: str


class ApiServer(lifecycles.Startable):
    """A Kubernetes API server over HTTPS on loopback, faithful to what gpuop relies on."""

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
        RBAC granting ``system:anonymous`` everything (for clients given no kubeconfig); a
        wrong token is still refused. ``faults``: what to get wrong on purpose (none by
        default); tests may change it, or replace it, while the server runs. ``token`` (the
        admin's) may be changed while the server runs too."""
        self._host = host
        self._port = port
        self.token = token or secrets.token_urlsafe(32)
        self.authorizer = Authorizer()
        """RBAC's rules, bound to user names; the access reviews ask it too."""
        self._users: dict[str, User] = {}
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
        self._certificates: certificates.ServingCertificates | None = None

    @property
    def anonymous_auth(self) -> bool:
        return self._anonymous_auth

    @anonymous_auth.setter
    def anonymous_auth(self, enabled: bool) -> None:
        self._anonymous_auth = enabled
        if enabled:
            self.authorizer.bind(ANONYMOUS, EVERYTHING)
        else:
            self.authorizer.unbind(ANONYMOUS)

    @property
    def url(self) -> str:
        if self._runner is None:
            raise RuntimeError("the API server is not running")
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"https://{host}:{self._bound_port}"

    @property
    def ca_pem(self) -> bytes:
        """The PEM certificate of the CA that signed the serving certificate; made at the
        first start and kept for the server's life, so a restart keeps kubeconfigs valid."""
        if self._certificates is None:
            raise RuntimeError("the API server has not started")
        return self._certificates.ca_pem

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context that trusts this server (and nothing else)."""
        return certificates.client_context(self.ca_pem)

    def add_user(self, name: str, rules: Iterable[Rule] = (), *, groups: Iterable[str] = ()) -> str:
        """Make a user whose bearer token (returned) authenticates as ``name`` in ``groups``
        and ``system:authenticated``, bound to ``rules`` (RBAC's ``PolicyRule``); with none,
        it may do only what every authenticated user may (discovery, self reviews)."""
        token = secrets.token_urlsafe(32)
        self._users[token] = User(name, (*dict.fromkeys(groups), AUTHENTICATED), uid=name)
        self.authorizer.bind(name, rules)
        return token

    async def start(self) -> None:
        for name in INITIAL_NAMESPACES:
            if self.store.get(kinds.NAMESPACES.group_resource, "", name) is None:
                self.registry.create(kinds.NAMESPACES, "", {"metadata": {"name": name}})
        routes = handlers.Handlers(
            self.registry,
            self.authorizer,
            bookmark_interval=self.bookmark_interval,
            server_address=lambda: self.url.removeprefix("https://"),
            watch_opened=lambda end: self.faults.watch_opened(end),
        )
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", routes.dispatch)
        app.on_response_prepare.append(self._record)
        # Cancel a handler when its client disconnects, so abandoned watches unregister.
        runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0
        )
        if self._certificates is None:
            self._certificates = certificates.issue(self._host)
        tls = certificates.server_context(self._certificates)
        await runner.setup()
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self._host, self._port))
            self._bound_port = listener.getsockname()[1]
            await web.SockSite(runner, listener, ssl_context=tls).start()
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

    def write_kubeconfig(
        self, path: Path, *, context: str = kubeconfigs.DEFAULT_CONTEXT, namespace: str = "default"
    ) -> Path:
        """A kubeconfig for the admin: the ``https`` URL, the CA that signed the serving
        certificate (``certificate-authority-data``) and the bearer token."""
        return kubeconfigs.write_kubeconfig(
            path, self.url, self.token, self.ca_pem, context=context, namespace=namespace
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
            if not unauthenticated:
                user = self._authenticate(request)
                attributes = attributes_of(request.method, request.path, request.query)
                if not self.authorizer.allows(user.name, user.groups, attributes):
                    raise authorizing.forbidden(user.name, attributes)
                request[handlers.USER] = user
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

    def _authenticate(self, request: web.Request) -> User:
        """The request's user, or 401 (a wrong token is refused even with anonymous auth)."""
        if "Authorization" not in request.headers:
            if self.anonymous_auth:
                return _ANONYMOUS
            raise errors.unauthorized()
        scheme, _, credential = request.headers["Authorization"].partition(" ")
        if scheme.lower() == "bearer":
            if hmac.compare_digest(credential.encode(), self.token.encode()):
                return ADMIN
            for token, user in self._users.items():
                if hmac.compare_digest(credential.encode(), token.encode()):
                    return user
        raise errors.unauthorized()
