"""`Connection`: one nats-py client and its JetStream context, for `NatsBus` and the parts it
is made of (`publishers`, `consumers`, `reading`, `manager`).

The first connect gets a bounded number of attempts; once connected the client rides
through any server restart, and each reconnect is counted and announced (`reconnected`: a
fetch waiting on a pull request lost with the old connection asks again at once). With an
`Identity` the connection replies on that identity's own inbox prefix (`gpuop.bus.grants`);
in callout mode it rereads its token at every reconnect (`gpuop.bus.tokens`). The nats-py
failures that a reconnect or a moment's patience cures are `TRANSIENT`, and `patiently`
retries a step through them until a deadline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import DEFAULT_INBOX_PREFIX, Client
from nats.js import JetStreamContext

from gpuop.bus import grants, publishing, tokens
from gpuop.bus.errors import BusUnavailable, PlacementPending, PublishTimeout
from gpuop.observability.redaction import redacted

log = logging.getLogger(__name__)

TRANSIENT: tuple[type[BaseException], ...] = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.NoStreamResponseError,
    asyncio.TimeoutError,
)
"""Failures that a reconnect or a moment's patience cures (on a cluster, also a stream whose
leader is gone and whose next one is not elected yet: no response from the stream)."""

ANY_NATS_ERROR: tuple[type[BaseException], ...] = (*TRANSIENT, nats.errors.Error)
START_RETRIED: tuple[type[BaseException], ...] = (*TRANSIENT, PublishTimeout, PlacementPending)
"""What `start` tries again: the transient failures, and a cluster whose members are not
all seen online yet (a refusal stops it at once)."""

RECONNECT_WAIT = 0.25
"""Seconds between connection attempts to the same server."""
PING_INTERVAL = 5.0
MAX_OUTSTANDING_PINGS = 3
"""A server that answers no ping for 15 s is given up and another of the list is tried: a
partition drops packets without closing the connection, and nats-py's defaults (two minutes
between pings) would leave a service talking to a cut-off server for four."""


class Connection:
    """One client of a NATS server list, with its JetStream context once connected."""

    def __init__(
        self,
        servers: Sequence[str],
        *,
        name: str,
        creds: str | None,
        token_file: str | None,
        identity: grants.Identity | None,
        publish_timeout: float,
        retry_for: float,
    ) -> None:
        self.servers = list(servers)
        self.name = name
        self.creds = creds
        self.identity = identity
        self.publish_timeout = publish_timeout
        """Seconds one request (a publish's receipt, an API call) may take."""
        self.retry_for = retry_for
        """Seconds a transient failure is retried for (the first connect, a start step)."""
        self.reconnected = asyncio.Event()
        """Set (and replaced by a new one) each time the connection comes back."""
        self.reconnects = 0
        """Connections lost and regained: a message sent across one may reach the server
        twice (nats-py sends what it had buffered again), so its duplicate is no alarm."""
        # callout mode: a token reread at every reconnect
        self._token = tokens.TokenFile(token_file) if token_file else None
        self._token_watch: asyncio.Task[None] | None = None
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._closing = False

    @property
    def inbox_prefix(self) -> str:
        """Where this connection's replies arrive: the identity's own prefix, or `_INBOX`."""
        if self.identity is None:
            return DEFAULT_INBOX_PREFIX.decode()
        return grants.inbox_prefix(self.identity)

    @property
    def max_payload(self) -> int:
        """Largest message, data and headers together, the server accepts."""
        if self._nc is None:
            return publishing.DEFAULT_MAX_PAYLOAD
        return int(self._nc.max_payload)

    @property
    def nc(self) -> Client:
        if self._nc is None:
            raise BusUnavailable("bus not started")
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise BusUnavailable("bus not started")
        return self._js

    def new_inbox(self) -> str:
        return self.nc.new_inbox()

    async def connect(self) -> None:
        """Connect, unless connected already."""
        if self._nc is None or self._nc.is_closed:
            self._nc = await self._connect()
            self._js = self._nc.jetstream(
                timeout=self.publish_timeout, publish_async_max_pending=4000
            )

    async def _connect(self) -> Client:
        # nats-py retries a failed first connect forever when reconnects are unlimited, so the
        # first connect gets a bounded number of attempts and the limit is lifted afterwards:
        # once connected, the client must ride through any server restart.
        attempts = max(1, int(self.retry_for / RECONNECT_WAIT))
        try:
            if self._token is not None:
                self._token.read()  # nats-py hides why a token callback failed
            nc = await tokens.connect(
                servers=self.servers,
                name=self.name,
                user_credentials=self.creds,
                token=self._token,
                allow_reconnect=True,
                max_reconnect_attempts=attempts,
                reconnect_time_wait=RECONNECT_WAIT,
                ping_interval=PING_INTERVAL,
                max_outstanding_pings=MAX_OUTSTANDING_PINGS,
                connect_timeout=2,
                drain_timeout=2,
                inbox_prefix=self.inbox_prefix,
                error_cb=_log_error,
                disconnected_cb=self._on_disconnect,
                reconnected_cb=self._on_reconnect,
            )
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            shown = ", ".join(redacted(server) for server in self.servers)
            raise BusUnavailable(f"cannot connect to {shown}: {exc!r}") from exc
        nc.options["max_reconnect_attempts"] = -1
        if self._token is not None:
            self._token_watch = asyncio.create_task(tokens.watch(nc, self._token))
        return nc

    async def _on_disconnect(self) -> None:
        if not self._closing:
            log.warning("disconnected from nats; reconnecting")

    async def _on_reconnect(self) -> None:
        await _log_reconnect()
        # pull requests die with the connection: every consumer asks again now, instead of
        # waiting out the fetch it sent before (`consumers.IDLE_FETCH_SECONDS`)
        self.reconnects += 1
        reconnected, self.reconnected = self.reconnected, asyncio.Event()
        reconnected.set()

    async def close(self) -> None:
        """Drain and close the client; nothing of it outlives this call."""
        self._closing = True
        if self._token_watch is not None:
            self._token_watch.cancel()
        if self._nc is not None and not self._nc.is_closed:
            try:
                await self._nc.drain()
            except (TimeoutError, OSError, nats.errors.Error) as exc:
                log.debug("drain on close: %r", exc)
                try:
                    await self._nc.close()
                except (TimeoutError, OSError, nats.errors.Error):
                    # nats-py's close stops at a dead transport before it stops its
                    # subscription tasks; stop them so nothing outlives the bus
                    for sub in self._nc._subs.values():
                        task = sub._wait_for_msgs_task
                        if task is not None and not task.done():
                            task.cancel()
        self._nc = self._js = None


async def patiently(step: Callable[[], Awaitable[object]], deadline: float) -> None:
    """`step`, tried again through `START_RETRIED` failures until `deadline`
    (`time.monotonic()`); `BusUnavailable` when it is still failing then."""
    delay = 0.1
    while True:
        try:
            await step()
            return
        except START_RETRIED as exc:
            if time.monotonic() + delay > deadline:
                raise BusUnavailable(f"streams and buckets not ready: {exc!r}") from exc
            log.info("streams and buckets not ready (%r); again in %.2g s", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


async def _log_error(exc: Exception) -> None:
    log.debug("nats client error: %r", exc)


async def _log_reconnect() -> None:
    log.info("reconnected to nats")
