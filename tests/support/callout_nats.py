"""deploy/nats in callout mode, in a real nats-server on loopback, with gpuop's auth callout
answering it from this process through an in-memory token authority.

The server runs nats-server.conf as shipped with `include "callout.conf"` in place of
accounts.conf (what the chart renders for nats.auth.mode=callout), on 127.0.0.1 with a
throwaway CA, as `shipped_nats` does. The callout (`gpuop.bus.callouts`) connects as its own
user `nats-auth` and answers with a `MemoryReviewer`, whose tokens a test issues per service
account and node.
"""

from __future__ import annotations

import asyncio
import secrets
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from prometheus_client import CollectorRegistry

from gpuop.bus import NatsBus, callouts, grants, launcher, nkeys, reviewers
from gpuop.bus.errors import BusUnavailable
from tests.support.shipped_nats import (
    CONFIG,
    NATS_DIR,
    loopback_config,
    rewrite,
    write_certificate,
)

CALLOUT = "callout.conf"
NAMESPACE = "gpuop-system"
SERVICE_ACCOUNTS = {role: f"gpuop-{role}" for role in grants.ROLES}
"""The ServiceAccount of each role, as the chart names them."""
PASSWORD_USERS = {
    "nats-auth": "NATS_AUTH_PASSWORD",
    "admin": "ADMIN_PASSWORD",
    "observer": "OBSERVER_PASSWORD",
}


def username(role: str) -> str:
    return f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNTS[role]}"


def callout_config(text: str, *, store: Path, tls: Path) -> str:
    """nats-server.conf in callout mode on loopback."""
    text = loopback_config(text, store=store, tls=tls)
    return rewrite(text, {'include "accounts.conf"': f'include "{CALLOUT}"'})


@dataclass
class CalloutNats:
    workdir: Path
    issuer: nkeys.KeyPair = field(
        default_factory=lambda: nkeys.KeyPair.generate(nkeys.Kind.ACCOUNT)
    )
    max_lifetime: float = 3600.0
    callout_issuers: list[nkeys.KeyPair] = field(default_factory=list)
    """The keys the callout signs with; empty: `issuer` alone."""
    reviewer: reviewers.MemoryReviewer = field(default_factory=reviewers.MemoryReviewer)
    caching: bool = False
    """Put `reviewers.CachingReviewer` in front of `reviewer`, as `gpuop nats-auth` does."""
    port: int = 0
    passwords: dict[str, str] = field(default_factory=dict)
    server_passwords: dict[str, str] = field(default_factory=dict)
    """What the server reads for a <USER>_PASSWORD variable, where not the user's password
    itself: the chart gives it bcrypt hashes."""
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    _process: asyncio.subprocess.Process | None = None
    _callout: asyncio.Task[None] | None = None
    _callout_nc: Client | None = None
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.passwords = {user: "p" + secrets.token_hex(16) for user in PASSWORD_USERS}
        self.metrics = callouts.CalloutMetrics(self.registry)

    @property
    def ca_file(self) -> Path:
        return self.workdir / "ca.crt"

    @property
    def log_file(self) -> Path:
        return self.workdir / "nats-server.log"

    @property
    def url(self) -> str:
        return f"tls://localhost:{self.port}"

    @property
    def admin_url(self) -> str:
        """`url` with the `admin` user's password in it."""
        return self.url.replace("tls://", f"tls://admin:{self.passwords['admin']}@")

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        write_certificate(self.workdir)
        config = callout_config(
            (NATS_DIR / CONFIG).read_text(encoding="utf-8"),
            store=self.workdir / "jetstream",
            tls=self.workdir,
        )
        (self.workdir / CONFIG).write_text(config, encoding="utf-8")
        (self.workdir / CALLOUT).write_bytes((NATS_DIR / CALLOUT).read_bytes())
        ports = self.workdir / "ports"
        ports.mkdir(exist_ok=True)
        env = {variable: self.passwords[user] for user, variable in PASSWORD_USERS.items()}
        env.update(self.server_passwords)
        env["NATS_AUTH_ISSUER"] = self.issuer.public_key
        try:
            self._process, ports_of = await launcher.run_server(
                self.workdir / CONFIG, ports, env=env, log=self.log_file
            )
        except BusUnavailable:
            raise AssertionError(
                f"nats-server did not start:\n{self.log_file.read_text()}"
            ) from None
        self.port = int(ports_of["nats"][0].rsplit(":", 1)[1])

    async def start_callout(self) -> None:
        accounts = callouts.Accounts.parse(
            f"{NAMESPACE}/{account}={role}" for role, account in SERVICE_ACCOUNTS.items()
        )
        authorizer = callouts.Authorizer(
            self.callout_issuers or self.issuer,
            reviewers.CachingReviewer(self.reviewer) if self.caching else self.reviewer,
            accounts,
            max_lifetime=self.max_lifetime,
            metrics=self.metrics,
        )
        self._callout_nc = await self.password_client("nats-auth")
        self._stopping = asyncio.Event()
        self._callout = asyncio.create_task(
            callouts.serve(self._callout_nc, authorizer, self._stopping)
        )
        await self._callout_nc.flush()

    async def stop_callout(self) -> None:
        self._stopping.set()
        if self._callout is not None:
            await self._callout
            self._callout = None
        if self._callout_nc is not None:
            await self._callout_nc.close()
            self._callout_nc = None

    async def restart_server(self) -> None:
        """The server again (with `issuer` as it is now) on a new port, the callout after it."""
        await self.stop()
        await self.start()
        await self.start_callout()

    async def stop(self) -> None:
        await self.stop_callout()
        process, self._process = self._process, None
        if process is not None:
            await launcher.terminate(process)

    async def make_streams(self) -> None:
        """The streams and buckets, as the orchestrator makes them (as admin; the caller
        points SSL_CERT_FILE at `ca_file`)."""
        admin = NatsBus(self.admin_url, name="test-admin")
        await admin.start()
        await admin.close()

    async def password_client(self, user: str, **options: Any) -> Client:
        host = self.url.replace("tls://", f"tls://{user}:{self.passwords[user]}@")
        return await nats.connect(
            host, tls=self.tls(), allow_reconnect=False, connect_timeout=5, **options
        )

    def token(self, role: str, node: str | None = None, **options: Any) -> str:
        return self.reviewer.issue(username(role), node=node, **options)

    async def token_client(self, token: str, identity: grants.Identity, **options: Any) -> Client:
        """A raw connection with `token`, replying on `identity`'s inbox prefix."""
        settings: dict[str, Any] = {"allow_reconnect": False, "connect_timeout": 5}
        settings.update(options)
        return await nats.connect(
            self.url,
            tls=self.tls(),
            token=token,
            inbox_prefix=grants.inbox_prefix(identity),
            **settings,
        )

    def decisions(self, reason: str) -> float:
        value = self.registry.get_sample_value(
            "gpuop_nats_auth_decisions_total", {"reason": reason}
        )
        return value or 0.0


@asynccontextmanager
async def running(workdir: Path, **options: Any) -> AsyncIterator[CalloutNats]:
    server = CalloutNats(workdir, **options)
    await server.start()
    try:
        await server.start_callout()
        yield server
    finally:
        await server.stop()
