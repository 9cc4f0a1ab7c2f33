"""`NatsBus`: the bus on NATS JetStream (nats-py), used by every service in production.

One noun a module, as nats.py keeps them; `NatsBus` holds them together behind the `Bus`
protocol:

    connection   the client: connect, reconnect, token, inbox, close (`Connection`)
    manager      streams created or checked at start, their leaders (`StreamManager`)
    publishers   publish with the server's receipt, retried, batched (`Publisher`)
    consumers    durable pull consumers feeding a `Dispatcher` (`Consumers`)
    reading      a subject's last message and reads of a stream (`Reader`)
    kv           the KV buckets (`open_bucket`)

Streams and buckets are created idempotently by `start()`. Publishing waits for the server's
receipt and retries transient failures for a while (safe: the event id dedupes); a first try
answered as a duplicate is someone else's message under our id (`IdTaken`). Each consumer is a
durable pull consumer whose fetch loop feeds a `Dispatcher`; it rides through server restarts
because the client reconnects and the consumer lives on the server. With an `Identity`, the
connection replies on that identity's own inbox prefix and creates every consumer in a form
its NATS permissions can bind (`gpuop.bus.grants`).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Sequence
from datetime import datetime

from nats.js import JetStreamContext
from nats.js.api import Placement

from gpuop.bus import grants, publishing, streams, tokens
from gpuop.bus.connection import Connection, patiently
from gpuop.bus.consumers import Consumers, NatsSubscription
from gpuop.bus.kv import NatsKeyValue, open_bucket
from gpuop.bus.manager import StreamManager
from gpuop.bus.protocol import Buckets, ConsumerSpec, Handler, PublishAck, StoredMessage
from gpuop.bus.publishers import Publisher
from gpuop.bus.reading import Reader
from gpuop.events import Envelope
from gpuop.observability.metrics import BusMetrics, registry


class NatsBus:
    """The bus on a NATS server with JetStream."""

    def __init__(
        self,
        servers: str | Sequence[str],
        *,
        prefix: str = "gpuop",
        name: str = "gpuop",
        creds: str | None = None,
        events_max_age: float = streams.DEFAULT_EVENTS_MAX_AGE,
        publish_timeout: float = 5.0,
        retry_for: float = 30.0,
        replicas: int = 1,
        placement: Sequence[str] = (),
        limits: streams.StoreLimits = streams.DEFAULT_LIMITS,
        metrics: BusMetrics | None = None,
        identity: grants.Identity | None = None,
        token_file: str | None = None,
        id_key_file: str | None = None,
    ) -> None:
        if isinstance(servers, str):
            servers = [url.strip() for url in servers.split(",") if url.strip()]
        if not 1 <= replicas <= 5:
            raise ValueError(f"replicas must be 1 to 5, not {replicas}")
        self.replicas = replicas
        """Replicas of every stream and bucket this bus creates (3 on a JetStream cluster)."""
        self.placement = Placement(tags=list(placement)) if placement else None
        """Server tags every replica's server must have (`az:east`); None: any server."""
        self.identity = identity
        """Who connects (`gpuop.bus.grants`): it replies on its own inbox prefix and reads
        the streams with consumers its permissions name; None: nats-py's `_INBOX`."""
        self.limits = limits
        """What each stream and bucket this bus creates may hold."""
        self._prefix = prefix
        self._events_max_age = events_max_age
        self._connection = Connection(
            servers,
            name=name,
            creds=creds,
            token_file=token_file,
            identity=identity,
            publish_timeout=publish_timeout,
            retry_for=retry_for,
        )
        # callout mode: ids keyed by a file of our own, not by the token
        secret = tokens.id_key(id_key_file) if id_key_file else _read_creds(creds)
        metrics = metrics or BusMetrics(registry())
        self._publisher = Publisher(
            self._connection,
            prefix=prefix,
            id_key=publishing.id_key(self._connection.servers, secret),
            metrics=metrics,
        )
        self._consumers = Consumers(self._connection, self, prefix=prefix, metrics=metrics)
        self._manager = StreamManager(self._connection, replicas=replicas, placement=self.placement)
        self._reader = Reader(self._connection, prefix=prefix, replicas=replicas)
        self._buckets: dict[str, NatsKeyValue] = {}

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def id_key(self) -> bytes:
        """What this publisher's message ids are keyed with (`publishing.message_id`)."""
        return self._publisher.id_key

    @property
    def inbox_prefix(self) -> str:
        """Where this connection's replies arrive: the identity's own prefix, or `_INBOX`."""
        return self._connection.inbox_prefix

    @property
    def max_payload(self) -> int:
        """Largest message, data and headers together, the server accepts."""
        return self._connection.max_payload

    @property
    def reconnected(self) -> asyncio.Event:
        """Set (and replaced by a new one) each time the connection comes back."""
        return self._connection.reconnected

    @property
    def js(self) -> JetStreamContext:
        return self._connection.js

    async def start(self) -> None:
        """Connect, and create or check every stream and bucket. On a cluster a creation
        forms a replica group, which a busy cluster (or one electing its meta leader) may not
        answer within one request's timeout: transient failures are retried for `retry_for`."""
        await self.connect()
        deadline = time.monotonic() + self._connection.retry_for
        for layout in streams.layouts(
            self._prefix, events_max_age=self._events_max_age, limits=self.limits
        ):
            await patiently(functools.partial(self._manager.ensure, layout), deadline)
        for bucket in Buckets:
            await patiently(functools.partial(self.kv, bucket), deadline)

    async def connect(self) -> None:
        """Connect without creating anything: for read-only tools such as `events tail`."""
        await self._connection.connect()

    async def stream_leader(self, stream: str) -> str:
        """The server that leads `stream` (a bucket's stream is `KV_<bucket>`); empty on one
        server without a cluster."""
        return await self._manager.leader(stream)

    async def step_down(self, stream: str) -> None:
        """Ask `stream`'s leader to hand over to another replica (JetStream's leader
        step-down), as an operator does before taking a server down."""
        await self._manager.step_down(stream)

    async def close(self) -> None:
        await self._consumers.stop_all()
        await self._connection.close()

    async def publish(self, envelope: Envelope, *, republish: bool = False) -> PublishAck:
        return await self._publisher.publish(envelope, republish=republish)

    async def publish_batch(
        self, envelopes: Sequence[Envelope], *, republish: bool = False
    ) -> list[PublishAck]:
        return await self._publisher.publish_batch(envelopes, republish=republish)

    async def publish_raw(
        self,
        subject: str,
        data: bytes,
        headers: dict[str, str] | None = None,
        *,
        republish: bool = False,
    ) -> PublishAck:
        """Publish bytes no model produced: replaying dead letters, hostile-input tests."""
        out = publishing.raw(self._prefix, subject, data, headers)
        return await self._publisher.publish_outgoing(out, republish=republish)

    async def consume(self, spec: ConsumerSpec, handler: Handler) -> NatsSubscription:
        return await self._consumers.consume(spec, handler)

    async def kv(self, bucket: Buckets | str) -> NatsKeyValue:
        name = streams.bucket_name(self._prefix, bucket)
        if name not in self._buckets:
            self._buckets[name] = await open_bucket(
                self._connection.js,
                name,
                new_inbox=self._connection.new_inbox,
                replicas=self.replicas,
                placement=self.placement,
                share=self.limits.share(bucket) if bucket in streams.SHARES else None,
                direct=bucket != Buckets.SAGAS,
                max_value_size=streams.VALUE_BYTES.get(bucket),
            )
        return self._buckets[name]

    async def last(self, subject: str) -> StoredMessage | None:
        return await self._reader.last(subject)

    def read(
        self, subject: str, *, since: datetime | None = None, follow: bool = False
    ) -> AsyncIterator[StoredMessage]:
        # the reader's own generator, not one around it: closing it releases the read's
        # turn and its inbox at once
        return self._reader.read(subject, since=since, follow=follow)


def _read_creds(creds: str | None) -> bytes | None:
    """The credentials file's bytes, for the message-id key; None without one or when it
    cannot be read (the connect then says why)."""
    if not creds:
        return None
    try:
        with open(creds, "rb") as file:
            return file.read()
    except OSError:
        return None
